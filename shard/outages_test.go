package shard_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// overlaps reports whether an outage overlaps the silence window of a
// deadline with threshold: what the scanner's outage rule defers on
// (invariant 6).
func overlaps(outs []shard.Outage, deadline int64, threshold time.Duration) bool {
	since := deadline - threshold.Milliseconds()
	for _, o := range outs {
		if o.Start < deadline && o.End > since {
			return true
		}
	}
	return false
}

// recordOutages moves the watermark from ms in n jumps of 4s, each followed
// by a step of 1s: n outages, none touching the next. It returns the
// watermark reached.
func recordOutages(t *testing.T, ctx context.Context, advance func(int64), ms int64, n int) int64 {
	t.Helper()
	for range n {
		ms += 4_000
		advance(ms)
		ms += 1_000
		advance(ms)
	}
	return ms
}

// TestManyOutagesKeepAnOldOne proves that the outage a long threshold's
// silence window overlaps is still there after more than 256 later
// outages, so the device is still deferred, not declared lost for silence
// inside our outage (invariant 6).
func TestManyOutagesKeepAnOldOne(t *testing.T) {
	ctx, s := newStore(t)
	const gap, threshold = 3 * time.Second, time.Hour
	base := int64(1_700_000_000_000)
	advance := func(ms int64) {
		t.Helper()
		if _, err := s.Watermarks().Advance(ctx, ms, gap); err != nil {
			t.Fatal(err)
		}
	}
	// A device last seen at base, deadline base+1h; ingest was out for a
	// minute ten minutes into its silence.
	deadline := base + threshold.Milliseconds()
	advance(base)
	advance(base + 10*60_000)
	advance(base + 11*60_000)
	// Scanners lag; 300 more outages come after the deadline.
	recordOutages(t, ctx, advance, deadline, 300)
	_, outs, err := s.Watermarks().Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !overlaps(outs, deadline, threshold) {
		t.Errorf("after %d outages, none overlaps the silence window of a %v threshold: the device would fire for silence inside an outage", len(outs), threshold)
	}
}

// TestOutagesAgeOutAndMerge proves that AdvanceMember drops an outage once
// the watermark is Keep past its end, and not before, and records touching
// jumps as one outage.
func TestOutagesAgeOutAndMerge(t *testing.T) {
	ctx, s := newStore(t)
	m := shard.Member{ID: "solo"}
	o := shard.Outages{Gap: 3 * time.Second, Keep: time.Hour}
	base := int64(1_700_000_000_000)
	advance := func(ms int64) {
		t.Helper()
		if _, dropped, err := s.Watermarks().AdvanceMember(ctx, m, ms, time.UnixMilli(ms), 0, o); err != nil || dropped != 0 {
			t.Fatalf("advance to base%+d: dropped %d, err %v", ms-base, dropped, err)
		}
	}
	read := func() []shard.Outage {
		t.Helper()
		_, outs, err := s.Watermarks().Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return outs
	}
	advance(base)
	advance(base + 5_000)  // an outage...
	advance(base + 10_000) // ...that goes on: the same outage
	if got, want := read(), []shard.Outage{{Start: base, End: base + 10_000}}; !slices.Equal(got, want) {
		t.Fatalf("touching jumps recorded as %v, want %v", got, want)
	}
	advance(base + 11_000)
	end := recordOutages(t, ctx, advance, base+11_000, 10)
	if got := read(); len(got) != 11 || got[0] != (shard.Outage{Start: base, End: base + 10_000}) {
		t.Fatalf("outages = %v, want the first and 10 more", got)
	}
	// The watermark jumps to the first outage's end + Keep (a new outage):
	// the first stays.
	keep := o.Keep.Milliseconds()
	advance(base + 10_000 + keep)
	if got := read(); len(got) != 12 || got[0].Start != base {
		t.Fatalf("first outage dropped at exactly Keep after its end: %v", got)
	}
	// Past it, going on with the same outage: the first goes, the others
	// stay.
	advance(base + 10_000 + keep + 4_000)
	want := []shard.Outage{{Start: base + 11_000, End: base + 15_000}, {Start: end - 5_000, End: end - 1_000}, {Start: end, End: base + 14_000 + keep}}
	if got := read(); len(got) != 11 || got[0] != want[0] || got[9] != want[1] || got[10] != want[2] {
		t.Errorf("outages = %v, want 11: from %v to %v, then %v", got, want[0], want[1], want[2])
	}
}

// TestThresholdsMax proves Max is the longest threshold in force, overrides
// included once loaded: what bounds how long an outage can matter.
func TestThresholdsMax(t *testing.T) {
	ctx, s := newStore(t)
	thr := shard.NewThresholds(s, time.Minute, map[string]time.Duration{"pump": time.Hour})
	if got := thr.Max(); got != time.Hour {
		t.Errorf("Max = %v, want 1h (a type's)", got)
	}
	if err := s.SetOverride(ctx, "dev-1", 48*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := thr.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if got := thr.Max(); got != 48*time.Hour {
		t.Errorf("Max = %v, want 48h (an override's)", got)
	}
}
