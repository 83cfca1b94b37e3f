package shard_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// TestClaimReadsDueUpToHorizon proves a claim returns only members due at or
// before the horizon (invariant 1 at the script level), at most limit of
// them, earliest first, and the head of the shard.
func TestClaimReadsDueUpToHorizon(t *testing.T) {
	ctx, s := newStore(t)
	for k := range 10 {
		upsert(t, s, 3, shard.Entry{ID: fmt.Sprintf("d%d", k), Deadline: int64(1000 + 100*k)})
	}
	l := acquire(t, s, 3, "a")

	c, err := s.Claim(ctx, shard.Deadlines, 3, l, 1500, 100, time.Now())
	due, head, hasHead := c.Due, c.Head, c.HasHead
	if err != nil {
		t.Fatal(err)
	}
	want := []shard.Entry{{"d0", 1000}, {"d1", 1100}, {"d2", 1200}, {"d3", 1300}, {"d4", 1400}, {"d5", 1500}}
	if !slices.Equal(due, want) {
		t.Errorf("got due %v, want %v", due, want)
	}
	if !hasHead || head != (shard.Entry{ID: "d0", Deadline: 1000}) {
		t.Errorf("got head %v (%v), want d0@1000", head, hasHead)
	}

	c, err = s.Claim(ctx, shard.Deadlines, 3, l, 1500, 2, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Due) != 2 {
		t.Errorf("got %d due with limit 2, want 2", len(c.Due))
	}

	c, err = s.Claim(ctx, shard.Deadlines, 3, l, 999, 100, time.Now())
	due, head, hasHead = c.Due, c.Head, c.HasHead
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 0 || !hasHead || head.Deadline != 1000 {
		t.Errorf("before the head: got due %v head %v, want none due and head at 1000", due, head)
	}

	l4 := acquire(t, s, 4, "a")
	if c, err := s.Claim(ctx, shard.Deadlines, 4, l4, 1<<50, 100, time.Now()); err != nil || len(c.Due) != 0 || c.HasHead {
		t.Errorf("empty shard: got due %v, head %v, err %v; want nothing", c.Due, c.HasHead, err)
	}
}

// TestSettleComparesBeforeRemoving proves invariant 4: settle removes a
// fired member only if its score is still the claimed one; a member reset in
// between survives with its new deadline and is reported revived. Moves are
// compare-and-move.
func TestSettleComparesBeforeRemoving(t *testing.T) {
	ctx, s := newStore(t)
	upsert(t, s, 0, shard.Entry{"kept", 100}, shard.Entry{"reset", 100}, shard.Entry{"moved", 100}, shard.Entry{"movereset", 100})
	l := acquire(t, s, 0, "a")
	c, err := s.Claim(ctx, shard.Deadlines, 0, l, 100, 10, time.Now())
	if err != nil || len(c.Due) != 4 {
		t.Fatalf("claim: got %v, %v; want 4 due", c.Due, err)
	}

	// Resets land between claim and settle (ZADD GT, as ingest writes them).
	upsert(t, s, 0, shard.Entry{"reset", 5000}, shard.Entry{"movereset", 7000})

	st, err := s.Settle(ctx, shard.Deadlines, 0, l,
		[]shard.Entry{{"kept", 100}, {"reset", 100}, {"gone", 100}},
		[]shard.Move{{ID: "moved", From: 100, To: 900}, {ID: "movereset", From: 100, To: 900}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Removed != 1 || st.Moved != 1 {
		t.Errorf("got removed %d moved %d, want 1 and 1", st.Removed, st.Moved)
	}
	if want := []shard.Entry{{"reset", 5000}}; !slices.Equal(st.Revived, want) {
		t.Errorf("got revived %v, want %v", st.Revived, want)
	}
	for id, want := range map[string]int64{"reset": 5000, "moved": 900, "movereset": 7000} {
		if got, ok := score(t, s, 0, id); !ok || got != want {
			t.Errorf("%s: got score %d (present %v), want %d", id, got, ok, want)
		}
	}
	if _, ok := score(t, s, 0, "kept"); ok {
		t.Errorf("kept: still present after settle, want removed")
	}
}
