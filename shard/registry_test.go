package shard_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestSeenMulti proves what a batch of sightings records for each device:
// a typed device gets an entry, an untyped new one costs none, a lost mark
// is cleared and handed back once.
func TestSeenMulti(t *testing.T) {
	ctx, s := newStore(t)
	if err := s.LostMarks().Mark(ctx, "was-lost", 1234, 1300); err != nil {
		t.Fatal(err)
	}
	ss := s.SeenMulti(ctx, []shard.Sighting{{ID: "typed", Type: "sensor"}, {ID: "plain"}, {ID: "was-lost"}}, 5000)
	for _, d := range ss {
		if d.Err != nil {
			t.Fatalf("%s: %v", d.ID, d.Err)
		}
	}
	if ss[0].Existed || ss[1].Existed || !ss[2].Existed || ss[2].Prev.LostDeadline != 1234 {
		t.Fatalf("first sighting: got %+v; want only was-lost existing, with its mark", ss)
	}
	devs, err := s.Devices(ctx, []string{"typed", "plain", "was-lost"})
	if err != nil {
		t.Fatal(err)
	}
	if devs[0].Type != "sensor" || devs[1] != (shard.Device{}) || devs[2].LostDeadline != 0 {
		t.Fatalf("registry after the sighting: got %+v", devs)
	}
	ss = s.SeenMulti(ctx, []shard.Sighting{{ID: "typed"}, {ID: "was-lost"}}, 6000)
	if !ss[0].Existed || ss[0].Prev.Type != "sensor" || ss[1].Prev.LostDeadline != 0 {
		t.Fatalf("second sighting: got %+v; want typed existing and no mark left to hand back", ss)
	}
}

// TestLostMarksSwapAndUndoInBatches proves the batched lost marks: a swap
// returns each device's previous mark and writes the new one; an undo puts
// back the previous mark only where the swap's mark still stands. On a
// single server the batch is one script run; on a Redis Cluster one run per
// partition, whose keys share a slot.
func TestLostMarksSwapAndUndoInBatches(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		ctx, s := newStore(t)
		checkLostMarkBatches(ctx, t, s)
	})
	t.Run("cluster", func(t *testing.T) {
		cluster := testenv.RedisClusterWith(t, servers.ClusterOptions{Masters: 3})
		checkLostMarkBatches(context.Background(), t, testenv.StoreOn(t, cluster.Addrs, "sw"))
	})
}

func checkLostMarkBatches(ctx context.Context, t *testing.T, s *shard.Store) {
	t.Helper()
	const n = 300 // across most of the partitions' slots
	var es []shard.Entry
	for j := range n {
		es = append(es, shard.Entry{ID: fmt.Sprintf("mark-%d", j), Deadline: int64(1000 + j)})
	}
	// Every third device already carries an earlier owner's mark.
	for j := 0; j < n; j += 3 {
		if err := s.LostMarks().Mark(ctx, es[j].ID, es[j].Deadline, 50); err != nil {
			t.Fatal(err)
		}
	}
	prev, errs := s.LostMarks().SwapMulti(ctx, es, 77)
	for j, err := range errs {
		if err != nil {
			t.Fatalf("swap %s: %v", es[j].ID, err)
		}
		want := shard.PrevMark{}
		if j%3 == 0 {
			want = shard.PrevMark{Deadline: es[j].Deadline, At: 50}
		}
		if prev[j] != want {
			t.Fatalf("swap %s: previous mark %+v, want %+v", es[j].ID, prev[j], want)
		}
	}
	// A later owner marked device 1 since: its mark must survive the undo.
	if err := s.LostMarks().Mark(ctx, es[1].ID, es[1].Deadline, 99); err != nil {
		t.Fatal(err)
	}
	for j, err := range s.LostMarks().UnmarkMulti(ctx, es, 77, prev) {
		if err != nil {
			t.Fatalf("undo %s: %v", es[j].ID, err)
		}
	}
	ids := make([]string, n)
	for j, e := range es {
		ids[j] = e.ID
	}
	devs, err := s.Devices(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	for j, d := range devs {
		var want [2]int64
		switch {
		case j == 1:
			want = [2]int64{es[j].Deadline, 99}
		case j%3 == 0:
			want = [2]int64{es[j].Deadline, 50}
		}
		if got := [2]int64{d.LostDeadline, d.LostAt}; got != want {
			t.Fatalf("after undo %s: mark %v, want %v", es[j].ID, got, want)
		}
	}
}
