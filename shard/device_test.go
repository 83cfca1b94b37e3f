package shard_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// movedID returns an id that leaves its shard when n shards double.
func movedID(t *testing.T, prefix string, n int) string {
	t.Helper()
	for k := range 1000 {
		id := fmt.Sprintf("%s-%d", prefix, k)
		if shard.Of(id, n) != shard.Of(id, 2*n) {
			return id
		}
	}
	t.Fatal("no moving id found")
	return ""
}

// TestDeviceOpsDuringDoubling proves that threshold changes and removals
// are fenced by topology: an API whose topology lags a
// doubling is refused by the shards, reads the topology again, and acts on
// the device in both shards that may hold it. A raised threshold moves
// both copies, so the effective deadline (the later one) is the last
// signal + the new threshold; a removal leaves no copy behind.
func TestDeviceOpsDuringDoubling(t *testing.T) {
	ctx, s := newStore(t)
	if _, err := s.InitTopology(ctx, 4); err != nil {
		t.Fatal(err)
	}
	thr := shard.NewThresholds(s, 10*time.Second, nil)
	// Watchers read the topology once and are never refreshed by a loop:
	// they lag the doubling below.
	stale := func() *shard.Devices {
		w, err := shard.NewWatcher(ctx, s, 4, time.Hour, nil)
		if err != nil {
			t.Fatal(err)
		}
		return shard.NewDevices(s, w, thr, nil)
	}
	forThreshold, forRemove := stale(), stale()

	base := time.Now().Add(time.Hour).UnixMilli()
	a, b := movedID(t, "thr", 4), movedID(t, "rm", 4)
	for _, id := range []string{a, b} {
		upsert(t, s, shard.Of(id, 4), shard.Entry{ID: id, Deadline: base + 10_000})
	}
	if _, err := s.Double(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	// A newer signal, written by an ingest that already places under 8.
	for _, id := range []string{a, b} {
		upsert(t, s, shard.Of(id, 8), shard.Entry{ID: id, Deadline: base + 500 + 10_000})
	}

	v, err := forThreshold.SetThreshold(ctx, a, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := v.Deadline, base+500+20_000; got != want {
		t.Errorf("deadline after raising the threshold: got %d, want %d (newer signal + new threshold)", got, want)
	}
	for _, c := range []struct {
		i    int
		want int64
	}{{shard.Of(a, 4), base + 20_000}, {shard.Of(a, 8), base + 500 + 20_000}} {
		if got, ok := score(t, s, c.i, a); !ok || got != c.want {
			t.Errorf("copy in shard %d: got %d (present %v), want %d", c.i, got, ok, c.want)
		}
	}

	removed, err := forRemove.Remove(ctx, b)
	if err != nil || !removed {
		t.Fatalf("remove: got %v, %v; want removed", removed, err)
	}
	for _, i := range []int{shard.Of(b, 4), shard.Of(b, 8)} {
		if got, ok := score(t, s, i, b); ok {
			t.Errorf("removed device still watched in shard %d at %d, want no copy left", i, got)
		}
	}
}

// TestSetThresholdAgainstCurrentScore proves the threshold write never
// acts on a stale read: it moves the deadline by the change of threshold
// from the score it finds, leaves an absent device absent (a device that
// fired is not re-added in the past) and leaves a due deadline alone (its
// scanner may be firing it).
func TestSetThresholdAgainstCurrentScore(t *testing.T) {
	ctx, s := newStore(t)
	w, err := shard.NewWatcher(ctx, s, 4, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	thr := shard.NewThresholds(s, 10*time.Second, map[string]time.Duration{"pump": 30 * time.Second})
	devs := shard.NewDevices(s, w, thr, nil)
	future := time.Now().Add(time.Hour).UnixMilli()
	past := time.Now().Add(-time.Second).UnixMilli()
	upsert(t, s, shard.Of("live", 4), shard.Entry{ID: "live", Deadline: future})
	upsert(t, s, shard.Of("due", 4), shard.Entry{ID: "due", Deadline: past})

	if _, err := devs.SetThreshold(ctx, "live", 4*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, _ := score(t, s, shard.Of("live", 4), "live"); got != future-6_000 {
		t.Errorf("lowered 10s to 4s: got %d, want %d", got, future-6_000)
	}
	// Removing the override goes back to the default.
	if _, err := devs.SetThreshold(ctx, "live", 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := score(t, s, shard.Of("live", 4), "live"); got != future {
		t.Errorf("override removed: got %d, want %d", got, future)
	}
	if _, err := devs.SetThreshold(ctx, "gone", time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, ok := score(t, s, shard.Of("gone", 4), "gone"); ok {
		t.Errorf("absent device got deadline %d, want it left absent", got)
	}
	if _, err := devs.SetThreshold(ctx, "due", time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, _ := score(t, s, shard.Of("due", 4), "due"); got != past {
		t.Errorf("due deadline: got %d, want %d left alone", got, past)
	}
}

// TestThresholdChangesSerialisedAcrossProcesses: two processes (each with
// its own Devices and threshold cache) change one device's threshold at
// once, many times. Each change moves the deadline by the change from the
// threshold it replaced, so in the end the deadline is the last signal +
// the threshold that won, not drifted by interleaved changes.
func TestThresholdChangesSerialisedAcrossProcesses(t *testing.T) {
	ctx, s := newStore(t)
	last := time.Now().Add(time.Hour).UnixMilli()
	const def = 2 * time.Second
	upsert(t, s, shard.Of("dev", 4), shard.Entry{ID: "dev", Deadline: last + def.Milliseconds()})
	var procs []*shard.Devices
	for range 2 {
		w, err := shard.NewWatcher(ctx, s, 4, time.Hour, nil)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, shard.NewDevices(s, w, shard.NewThresholds(s, def, nil), nil))
	}
	var wg sync.WaitGroup
	for p, devs := range procs {
		wg.Go(func() {
			for k := range 60 {
				thr := []time.Duration{time.Second, 3 * time.Second, 0}[(k+p)%3]
				if _, err := devs.SetThreshold(ctx, "dev", thr); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	thr := shard.NewThresholds(s, def, nil)
	if err := thr.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	want := last + thr.For("dev", "").Milliseconds()
	if got, _ := score(t, s, shard.Of("dev", 4), "dev"); got != want {
		t.Errorf("deadline after interleaved changes: got %d, want %d (last signal + %v); drifted by %dms", got, want, thr.For("dev", ""), got-want)
	}
}

// TestLeftoverMarkIsNotLost: a scanner that marked a device and died
// before publishing leaves its mark behind; once the device is watched at a
// later deadline, the device reads as not lost. Absent or still at the
// marked deadline, it reads as lost.
func TestLeftoverMarkIsNotLost(t *testing.T) {
	ctx, s, devs := newDevices(t, 4, 10*time.Second)
	const id = "leftover"
	d := time.Now().UnixMilli()
	lost := func(want bool) {
		t.Helper()
		v, err := devs.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if v.Lost != want {
			t.Errorf("lost = %v, want %v: %+v", v.Lost, want, v)
		}
	}
	if err := s.LostMarks().Mark(ctx, id, d, d); err != nil {
		t.Fatal(err)
	}
	lost(true) // absent and marked
	upsert(t, s, shard.Of(id, 4), shard.Entry{ID: id, Deadline: d})
	lost(true) // marked, not yet settled
	upsert(t, s, shard.Of(id, 4), shard.Entry{ID: id, Deadline: d + 5_000})
	lost(false) // signalled since the mark
}

// TestLoweredThresholdNeverSoonerThanItself: lowering a threshold moves the
// deadline back by the change, but never closer than the new threshold from
// the change. While thresholds flip, a signal written under another
// threshold may sit behind the score, so the score cannot prove the device
// silent for longer than that.
func TestLoweredThresholdNeverSoonerThanItself(t *testing.T) {
	ctx, s := newStore(t)
	w, err := shard.NewWatcher(ctx, s, 4, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	devs := shard.NewDevices(s, w, shard.NewThresholds(s, 10*time.Second, nil), nil)
	const id = "quiet"
	// Last signal 8s ago under a 10s threshold: 2s left.
	dl := time.Now().Add(2 * time.Second).UnixMilli()
	upsert(t, s, shard.Of(id, 4), shard.Entry{ID: id, Deadline: dl})
	if _, err := devs.SetThreshold(ctx, id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// The shift alone gives 3s ago. The floor is the earlier of the old
	// deadline (2s ahead) and the new threshold from now (5s ahead).
	if got, _ := score(t, s, shard.Of(id, 4), id); got != dl {
		t.Errorf("lowered 10s to 5s with 2s left: deadline %d, want %d kept", got, dl)
	}
	// A recent signal: the shift stays above the floor and stands.
	dl2 := time.Now().Add(9 * time.Second).UnixMilli()
	upsert(t, s, shard.Of(id, 4), shard.Entry{ID: id, Deadline: dl2})
	if _, err := devs.SetThreshold(ctx, id, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	got, _ := score(t, s, shard.Of(id, 4), id)
	// Threshold 5s → 2s: shift -3s from dl2 (9s ahead) gives 6s ahead; the
	// floor min(dl2, now+2s) is below it, so the shift stands.
	if got != dl2-3_000 {
		t.Errorf("lowered 5s to 2s with 9s left: deadline %d, want %d", got, dl2-3_000)
	}
}
