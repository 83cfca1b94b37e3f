package shard_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// TestWatermarkRecordsOutages proves the watermark only moves forward and a
// jump larger than the gap is recorded as an outage (invariant 6's input).
func TestWatermarkRecordsOutages(t *testing.T) {
	ctx, s := newStore(t)
	if wm, outs, err := s.Watermark(ctx); err != nil || wm != 0 || len(outs) != 0 {
		t.Fatalf("fresh: got %d %v %v, want 0 and no outages", wm, outs, err)
	}
	gap := time.Second
	for _, ms := range []int64{10_000, 10_500, 10_200, 11_000, 15_000, 15_100} {
		if _, err := s.AdvanceWatermark(ctx, ms, gap); err != nil {
			t.Fatal(err)
		}
	}
	wm, outs, err := s.Watermark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if wm != 15_100 {
		t.Errorf("got watermark %d, want 15100", wm)
	}
	if want := []shard.Outage{{11_000, 15_000}}; !slices.Equal(outs, want) {
		t.Errorf("got outages %v, want %v", outs, want)
	}
}

// TestMemberWatermark proves invariant 6 for several ingest members: a
// shared group has consumed only up to its slowest member, a member outside
// any group stands on its own, a dead member holds the watermark back only
// until its timeout, and the gap it leaves is recorded as an outage.
func TestMemberWatermark(t *testing.T) {
	ctx, s := newStore(t)
	base := time.UnixMilli(1_700_000_000_000)
	const timeout, gap = 10 * time.Second, 3 * time.Second
	a := shard.Member{Group: "g", ID: "a"}
	b := shard.Member{Group: "g", ID: "b"}
	adv := func(m shard.Member, at time.Duration, now time.Duration) int64 {
		t.Helper()
		wm, _, err := s.AdvanceMember(ctx, m, base.Add(at).UnixMilli(), base.Add(now), timeout, shard.Outages{Gap: gap})
		if err != nil {
			t.Fatal(err)
		}
		return wm
	}
	want := func(got int64, at time.Duration) {
		t.Helper()
		if w := base.Add(at).UnixMilli(); got != w {
			t.Fatalf("watermark = base%+dms, want base%+dms", got-base.UnixMilli(), w-base.UnixMilli())
		}
	}
	want(adv(a, 0, 0), 0)
	want(adv(b, time.Second, time.Second), 0) // a is the slowest of the group
	want(adv(a, 2*time.Second, 2*time.Second), time.Second)
	// b dies at 1s; a keeps going. The group waits for b until its timeout.
	want(adv(a, 5*time.Second, 5*time.Second), time.Second)
	want(adv(a, 11*time.Second, 11*time.Second), time.Second)
	want(adv(a, 12*time.Second, 12*time.Second), 12*time.Second) // b dropped
	_, outs, err := s.Watermark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 1 || outs[0].Start != base.Add(time.Second).UnixMilli() || outs[0].End != base.Add(12*time.Second).UnixMilli() {
		t.Fatalf("outages = %+v, want one from base+1s to base+12s", outs)
	}
	// A member outside any group consumes everything: it alone moves the
	// watermark while the group lags.
	solo := shard.Member{ID: "solo"}
	want(adv(solo, 20*time.Second, 20*time.Second), 20*time.Second)
	if err := s.LeaveMember(ctx, solo); err != nil {
		t.Fatal(err)
	}
	ms, err := s.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ms["|solo"]; ok || len(ms) != 1 {
		t.Fatalf("members after leave = %v, want only g|a", ms)
	}
}
