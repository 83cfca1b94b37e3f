package shard_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/sigwatch/sigwatch/shard"
)

// TestUpsertNamesAbsentIDsOnce proves the write path's contract: deadlines
// only move forward (ZADD GT), the ids absent before the write are returned
// once each, even when an id appears twice in a batch or a batch spans the
// script's chunks, and a repeated write is idempotent and reports nothing.
func TestUpsertNamesAbsentIDsOnce(t *testing.T) {
	ctx, s := newStore(t)
	const n = 2500 // more members than the script handles per chunk
	var present []shard.Entry
	for j := 0; j < n; j += 2 {
		present = append(present, shard.Entry{ID: fmt.Sprintf("d%04d", j), Deadline: 5000})
	}
	upsert(t, s, 0, present...)

	es := make([]shard.Entry, 0, n+2)
	for j := range n {
		es = append(es, shard.Entry{ID: fmt.Sprintf("d%04d", j), Deadline: int64(1000 + 10*j)})
	}
	// Twice in the batch: absent before, so reported once, at its later deadline.
	es = append(es, shard.Entry{ID: "d0001", Deadline: 9000}, shard.Entry{ID: "d2499", Deadline: 1})
	added, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: es})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(added)
	var want []string
	for j := 1; j < n; j += 2 {
		want = append(want, fmt.Sprintf("d%04d", j))
	}
	if !slices.Equal(added, want) {
		t.Fatalf("got %d added ids (first %v), want the %d absent ones once each", len(added), added[:min(3, len(added))], len(want))
	}
	for _, c := range []struct {
		id   string
		want int64
	}{{"d0000", 5000}, {"d0400", 5000}, {"d0402", 5020}, {"d0001", 9000}, {"d2499", 1000 + 10*2499}, {"d0003", 1030}} {
		if got, ok := score(t, s, 0, c.id); !ok || got != c.want {
			t.Errorf("deadline of %s: got %d (present %v), want %d", c.id, got, ok, c.want)
		}
	}
	again, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: es})
	if err != nil || len(again) != 0 {
		t.Errorf("repeated upsert: got %d added, err %v; want none", len(again), err)
	}

	// Present ids given twice take the native path at their later deadline;
	// an absent id beside a repeated present one is still reported.
	dup := []shard.Entry{{ID: "d0000", Deadline: 7000}, {ID: "d0002", Deadline: 8000}, {ID: "d0000", Deadline: 7500}}
	if added, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: dup}); err != nil || len(added) != 0 {
		t.Errorf("upsert of present ids given twice: got added %v, err %v; want none", added, err)
	}
	dup = append(dup, shard.Entry{ID: "fresh", Deadline: 100}, shard.Entry{ID: "d0000", Deadline: 9999})
	if added, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: dup}); err != nil || !slices.Equal(added, []string{"fresh"}) {
		t.Errorf("upsert beside a repeated present id: got added %v, err %v; want [fresh]", added, err)
	}
	for id, want := range map[string]int64{"d0000": 9999, "d0002": 8000, "fresh": 100} {
		if got, ok := score(t, s, 0, id); !ok || got != want {
			t.Errorf("deadline of %s: got %d (present %v), want %d", id, got, ok, want)
		}
	}
}
