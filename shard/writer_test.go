package shard_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestWriterAnnouncesItsEpoch proves the writer side of the drain: a writer
// reports the epoch it writes with, moves on when its topology does, and
// removes its report when it stops; a silent writer stops counting after
// WriterTimeout.
func TestWriterAnnouncesItsEpoch(t *testing.T) {
	ctx, s := newStore(t)
	var (
		mu   sync.Mutex
		topo = shard.Topology{Shards: 4, Epoch: 1}
	)
	current := func() shard.Topology { mu.Lock(); defer mu.Unlock(); return topo }
	w := shard.NewWriter(s, "w1", current, s.Topology)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(rctx, nil, nil) }()
	reported := func(want int64) func() bool {
		return func() bool {
			rs, err := s.Writers(ctx)
			return err == nil && rs["w1"].Epoch == want
		}
	}
	testenv.WaitFor(t, 2*time.Second, "w1 to report epoch 1", reported(1))
	mu.Lock()
	topo = shard.Topology{Shards: 8, Prev: 4, Epoch: 2}
	mu.Unlock()
	testenv.WaitFor(t, time.Second, "w1 to report epoch 2", reported(2))
	rs, _ := s.Writers(ctx)
	if ok, lagging := shard.WritersCurrent(rs, 2, time.Now()); !ok {
		t.Errorf("writers lagging %v at epoch 2, want none", lagging)
	}
	if ok, lagging := shard.WritersCurrent(rs, 3, time.Now()); ok || len(lagging) != 1 {
		t.Errorf("at epoch 3: got current %v lagging %v, want w1 lagging", ok, lagging)
	}
	if ok, _ := shard.WritersCurrent(rs, 3, time.Now().Add(shard.WriterTimeout+time.Second)); !ok {
		t.Errorf("a writer silent past WriterTimeout still holds the drain back")
	}
	cancel()
	<-done
	if rs, _ := s.Writers(ctx); len(rs) != 0 {
		t.Errorf("reports after the writer stopped: %v, want none", rs)
	}
}
