package shard_test

import (
	"slices"
	"testing"
	"time"
)

// TestReserveSlots proves the pacing the alarm's rate limits rely on: slots
// of one type are one emission interval apart with no burst beyond the
// first, types are paced apart from each other, the total interval holds
// across types, a reservation never gets a slot before now, and a type
// idle for long starts again at now.
func TestReserveSlots(t *testing.T) {
	ctx, s := newStore(t)
	const now = 1_000_000
	reserve := func(now int64, per, all time.Duration, types ...string) []int64 {
		t.Helper()
		v, err := s.ReserveSlots(ctx, now, types, per, all)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got, want := reserve(now, 100*time.Millisecond, 0, "a", "a", "b", "a"), []int64{now, now + 100, now, now + 200}; !slices.Equal(got, want) {
		t.Errorf("per type: slots %v, want %v", got, want)
	}
	// A later call goes on from the TAT, not from its own now.
	if got, want := reserve(now+50, 100*time.Millisecond, 0, "a", "b"), []int64{now + 300, now + 100}; !slices.Equal(got, want) {
		t.Errorf("per type, later: slots %v, want %v", got, want)
	}
	// Idle long enough: back to now.
	if got, want := reserve(now+10_000, 100*time.Millisecond, 0, "a"), []int64{now + 10_000}; !slices.Equal(got, want) {
		t.Errorf("after idle: slots %v, want %v", got, want)
	}
	// A total cap paces the types together; each type's own TAT holds too.
	const t0 = 2_000_000
	if got, want := reserve(t0, 100*time.Millisecond, 60*time.Millisecond, "c", "d", "c", "d"), []int64{t0, t0 + 60, t0 + 120, t0 + 180}; !slices.Equal(got, want) {
		t.Errorf("total: slots %v, want %v", got, want)
	}
	if got, want := reserve(t0, 100*time.Millisecond, 60*time.Millisecond, "c"), []int64{t0 + 240}; !slices.Equal(got, want) {
		t.Errorf("total, next: slots %v, want %v", got, want)
	}
	// Only a total cap: no per-type key is needed.
	const t1 = 3_000_000
	if got, want := reserve(t1, 0, 250*time.Millisecond, "e", "e", "f"), []int64{t1, t1 + 250, t1 + 500}; !slices.Equal(got, want) {
		t.Errorf("total only: slots %v, want %v", got, want)
	}
}
