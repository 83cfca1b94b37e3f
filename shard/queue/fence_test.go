package queue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// fencer is a test Fencer that hands out increasing fences.
type fencer struct{ n atomic.Uint64 }

func (f *fencer) Fence(context.Context, shard.Lease) (uint64, error) { return f.n.Add(1), nil }

// TestFencedBatchSettlesNothing proves the engine's side of invariant 11:
// each lease is fenced before its first claim and every batch carries that
// fence; a batch the handler reports fenced out settles nothing (even what
// the handler says it handled) and the loop gives up its lease, so that
// the shard is taken again under a new fence.
func TestFencedBatchSettlesNothing(t *testing.T) {
	h := newHarness(t)
	h.add(shard.Entry{ID: "d1", Deadline: 1}, shard.Entry{ID: "d2", Deadline: 1})
	var (
		mu     sync.Mutex
		fences []uint64
		sizes  []int
	)
	hd := &handler{fire: func(b Batch) ([]shard.Entry, []shard.Move, error) {
		mu.Lock()
		defer mu.Unlock()
		fences = append(fences, b.Fence)
		sizes = append(sizes, len(b.Due))
		if len(fences) == 1 {
			return b.Due, nil, fmt.Errorf("publish refused: %w", ErrFenced)
		}
		return b.Due, nil, nil
	}}
	f := &fencer{}
	h.runUntil(hd, func(o *Options) { o.Fencer = f }, "the batch fired under a second fence", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(fences) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if fences[0] != 1 || fences[1] != 2 {
		t.Errorf("batches carried fences %v, want 1 then 2 (a new fence after the fenced-out batch)", fences)
	}
	if sizes[1] != 2 {
		t.Errorf("the batch after the fenced-out one had %d entries, want 2: the fenced-out batch settled something", sizes[1])
	}
	if _, ok := h.score("d1"); ok {
		t.Errorf("d1 still due after the batch under the second fence was handled")
	}
}

// TestBatchHeldEndsWithTheLease proves that a batch knows when its lease
// has surely run out by the replica's own clock: once renewals stop
// reaching Redis for longer than the lease time (as in a long pause or a
// partition), Batch.Held reports false, so a handler does nothing the
// lease cannot fence.
func TestBatchHeldEndsWithTheLease(t *testing.T) {
	h := newHarness(t)
	h.add(shard.Entry{ID: "d1", Deadline: 1})
	proxy := testenv.NewProxy(t, h.env.Redis.Addr)
	store := testenv.StoreOn(t, []string{proxy.Addr}, "sw")
	topo, err := shard.NewWatcher(h.ctx, store, 1, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = time.Second
	type seen struct{ before, after bool }
	got := make(chan seen, 1)
	hd := &handler{fire: func(b Batch) ([]shard.Entry, []shard.Move, error) {
		s := seen{before: b.Held()}
		proxy.Hold()
		time.Sleep(ttl + 500*time.Millisecond)
		s.after = b.Held()
		proxy.Release()
		select {
		case got <- s:
		default:
		}
		return nil, nil, ErrFenced
	}}
	e, err := New(Options{Replica: "a", Family: shard.Deadlines, Rebalance: 100 * time.Millisecond,
		Config: Config{LeaseTTL: ttl, Poll: 10 * time.Millisecond}}, store, topo, hd, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(h.ctx)
	ran := make(chan error, 1)
	go func() { ran <- e.Run(ctx) }()
	select {
	case s := <-got:
		if !s.before || s.after {
			t.Errorf("Held was %v at the claim and %v after renewals failed for longer than the lease, want true then false", s.before, s.after)
		}
	case <-time.After(10 * time.Second):
		t.Error("no batch fired within 10s")
	}
	cancel()
	<-ran
}
