package shard_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// TestWatermarkRecordsOutages proves the watermark only moves forward and a
// jump larger than the gap is recorded as an outage (invariant 6's input).
func TestWatermarkRecordsOutages(t *testing.T) {
	ctx, s := newStore(t)
	if wm, outs, err := s.Watermarks().Read(ctx); err != nil || wm != 0 || len(outs) != 0 {
		t.Fatalf("fresh: got %d %v %v, want 0 and no outages", wm, outs, err)
	}
	gap := time.Second
	for _, ms := range []int64{10_000, 10_500, 10_200, 11_000, 15_000, 15_100} {
		if _, err := s.Watermarks().Advance(ctx, ms, gap); err != nil {
			t.Fatal(err)
		}
	}
	wm, outs, err := s.Watermarks().Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if wm != 15_100 {
		t.Errorf("got watermark %d, want 15100", wm)
	}
	if want := []shard.Outage{{Start: 11_000, End: 15_000}}; !slices.Equal(outs, want) {
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
		wm, _, err := s.Watermarks().AdvanceMember(ctx, m, base.Add(at).UnixMilli(), base.Add(now), timeout, shard.Outages{Gap: gap})
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
	_, outs, err := s.Watermarks().Read(ctx)
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
	if err := s.Watermarks().Leave(ctx, solo); err != nil {
		t.Fatal(err)
	}
	ms, err := s.Watermarks().Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ms["|solo"]; ok || len(ms) != 1 {
		t.Fatalf("members after leave = %v, want only g|a", ms)
	}
}

// TestMemberBreakOutage proves that a member whose broker connection broke
// gets its outage recorded whatever the gap's length (invariant 6): from
// its last report, or the global watermark if the others vouched for
// later, through the end it asks for, with the reconnect grace it carries;
// before the watermark moves past it. An outage that overlaps the last one
// is merged into it, whichever began first.
func TestMemberBreakOutage(t *testing.T) {
	ctx, s := newStore(t)
	const gap = 3 * time.Second
	base := int64(1_700_000_000_000)
	adv := func(m shard.Member, at int64, o shard.Outages) int64 {
		t.Helper()
		o.Gap = gap
		if o.Through != 0 {
			o.Through += base
		}
		if o.GraceFrom != 0 {
			o.GraceFrom += base
		}
		wm, _, err := s.Watermarks().AdvanceMember(ctx, m, base+at, time.UnixMilli(base+at), 0, o)
		if err != nil {
			t.Fatal(err)
		}
		return wm - base
	}
	outages := func() []shard.Outage {
		t.Helper()
		_, outs, err := s.Watermarks().Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for j := range outs {
			outs[j].Start -= base
			outs[j].End -= base
			if outs[j].GraceFrom != 0 {
				outs[j].GraceFrom -= base
			}
		}
		return outs
	}
	a := shard.Member{Group: "g", ID: "a"}
	b := shard.Member{Group: "g", ID: "b"}
	adv(a, 1_000, shard.Outages{})
	adv(b, 1_000, shard.Outages{})

	// a's connection broke: a 2 s gap, below the outage threshold, is
	// still an outage, with the grace a broker restart gives.
	if wm := adv(a, 3_000, shard.Outages{Through: 5_000, GraceFrom: 3_000}); wm != 1_000 {
		t.Fatalf("watermark = base+%d, want b's 1000", wm)
	}
	if got, want := outages(), []shard.Outage{{Start: 1_000, End: 5_000, GraceFrom: 3_000}}; !slices.Equal(got, want) {
		t.Fatalf("after a's break: outages %v, want %v", got, want)
	}
	// b's break overlaps: one outage, reaching b's end.
	adv(b, 3_100, shard.Outages{Through: 5_100, GraceFrom: 3_100})
	if got, want := outages(), []shard.Outage{{Start: 1_000, End: 5_100, GraceFrom: 3_100}}; !slices.Equal(got, want) {
		t.Fatalf("after b's break: outages %v, want %v", got, want)
	}
	// The group moves on in steps below the threshold: no outage.
	adv(a, 5_500, shard.Outages{})
	adv(b, 5_500, shard.Outages{})
	// A break the others already vouched past is no outage.
	c := shard.Member{ID: "c"} // outside the group, consuming alone
	adv(c, 5_000, shard.Outages{Through: 5_400})
	if got := outages(); len(got) != 1 {
		t.Fatalf("a break the others vouched past: outages %v, want still one", got)
	}
	// Only the part after what the others vouched for is: c's break from
	// 5 000 through 9 000 is an outage from the watermark, 8 000, on.
	adv(a, 8_000, shard.Outages{})
	adv(b, 8_000, shard.Outages{})
	if wm := adv(c, 9_000, shard.Outages{Through: 9_000}); wm != 9_000 {
		t.Fatalf("watermark = base+%d, want c's 9000", wm)
	}
	if got, want := outages()[1:], []shard.Outage{{Start: 8_000, End: 9_000}}; !slices.Equal(got, want) {
		t.Fatalf("a break past the others: outages %v, want %v", got, want)
	}
	// An outage recorded later that begins earlier merges into the last
	// one it overlaps; one entirely before it is an outage of its own.
	if err := s.Watermarks().AddOutage(ctx, shard.Outage{Start: base + 7_000, End: base + 8_500}); err != nil {
		t.Fatal(err)
	}
	if err := s.Watermarks().AddOutage(ctx, shard.Outage{Start: base + 6_000, End: base + 6_500}); err != nil {
		t.Fatal(err)
	}
	if got, want := outages()[1:], []shard.Outage{{Start: 7_000, End: 9_000}, {Start: 6_000, End: 6_500}}; !slices.Equal(got, want) {
		t.Fatalf("outages recorded out of order: %v, want %v", got, want)
	}
}

// TestWatermarkRisesAreAnnounced proves that every rise of the watermark,
// by either script that moves it, is announced to WatermarkMoves
// subscribers, and a call that does not move it announces nothing: a
// scanner held back by the watermark reads it as soon as it rose.
func TestWatermarkRisesAreAnnounced(t *testing.T) {
	ctx, s := newStore(t)
	subscribed := make(chan struct{}, 1)
	moved := make(chan struct{}, 16)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.Watermarks().Moves(sctx, func() { subscribed <- struct{}{} }, func() { moved <- struct{}{} })
	select {
	case <-subscribed:
	case <-time.After(5 * time.Second):
		t.Fatal("not subscribed after 5s")
	}
	expect := func(what string, want bool) {
		t.Helper()
		select {
		case <-moved:
			if !want {
				t.Fatalf("%s: announced, want nothing", what)
			}
		case <-time.After(300 * time.Millisecond):
			if want {
				t.Fatalf("%s: not announced within 300ms", what)
			}
		}
	}
	base := time.Now().UnixMilli()
	if _, err := s.Watermarks().Advance(ctx, base, time.Hour); err != nil {
		t.Fatal(err)
	}
	expect("first watermark", true)
	if _, err := s.Watermarks().Advance(ctx, base, time.Hour); err != nil {
		t.Fatal(err)
	}
	expect("the same watermark again", false)
	m := shard.Member{ID: "a"}
	if _, _, err := s.Watermarks().AdvanceMember(ctx, m, base+10, time.UnixMilli(base+10), 0, shard.Outages{Gap: time.Hour}); err != nil {
		t.Fatal(err)
	}
	expect("a member's rise", true)
	if _, _, err := s.Watermarks().AdvanceMember(ctx, m, base+5, time.UnixMilli(base+10), 0, shard.Outages{Gap: time.Hour}); err != nil {
		t.Fatal(err)
	}
	expect("a member behind the watermark", false)
}
