package shard_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// seenAs registers ids with type typ, as ingest does on a first sighting.
func seenAs(t *testing.T, s *shard.Store, typ string, ids ...string) {
	t.Helper()
	ss := make([]shard.Sighting, len(ids))
	for j, id := range ids {
		ss[j] = shard.Sighting{ID: id, Type: typ}
	}
	for _, d := range s.SeenMulti(t.Context(), ss, time.Now().UnixMilli()) {
		if d.Err != nil {
			t.Fatal(d.Err)
		}
	}
}

// TestTypeThresholdPrecedence: a per-device override comes first, then
// the type's run-time setting, then the configuration, then the default;
// removing the run-time setting goes back to the configuration's, and each
// value says where it comes from.
func TestTypeThresholdPrecedence(t *testing.T) {
	ctx, s := newStore(t)
	w, err := shard.NewWatcher(ctx, s, 4, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	thr := shard.NewThresholds(s, 10*time.Second, map[string]time.Duration{"pump": 30 * time.Second})
	thr.Confirm = map[string]time.Duration{"pump": 5 * time.Second}
	devs := shard.NewDevices(s, w, thr, nil)
	seenAs(t, s, "pump", "p1", "p2")
	if _, err := devs.SetThreshold(ctx, "p2", time.Minute); err != nil {
		t.Fatal(err)
	}
	set := func(th time.Duration, conf *time.Duration) shard.TypeView {
		t.Helper()
		v, _, err := devs.SetType(ctx, "pump", func(cur shard.TypeSetting) shard.TypeSetting {
			cur.Threshold = th
			if conf != nil {
				cur.Confirm, cur.ConfirmSet = *conf, true
			}
			return cur
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	zero := time.Duration(0)
	v := set(2*time.Minute, &zero)
	want := shard.TypeView{Type: "pump", Threshold: "2m0s", ThresholdMS: 120_000, ThresholdFrom: shard.FromRuntime,
		ConfirmAfter: "0s", ConfirmAfterMS: 0, ConfirmAfterFrom: shard.FromRuntime}
	if v != want {
		t.Errorf("after PUT: got %+v, want %+v", v, want)
	}
	if got := thr.For("p1", "pump"); got != 2*time.Minute {
		t.Errorf("For(p1) = %v, want the run-time 2m", got)
	}
	if got := thr.For("p2", "pump"); got != time.Minute {
		t.Errorf("For(p2) = %v, want its own override 1m", got)
	}
	if got := thr.ConfirmAfter("pump"); got != 0 {
		t.Errorf("ConfirmAfter = %v, want the run-time 0s over the configured 5s", got)
	}
	// A second process sees it at its next reload.
	other := shard.NewThresholds(s, 10*time.Second, map[string]time.Duration{"pump": 30 * time.Second})
	if err := other.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if got := other.For("p1", "pump"); got != 2*time.Minute {
		t.Errorf("another process: For(p1) = %v, want 2m", got)
	}
	// Only the confirm_after is kept: the threshold is the configuration's.
	v = set(0, nil)
	if v.ThresholdFrom != shard.FromConfig || v.ThresholdMS != 30_000 || v.ConfirmAfterFrom != shard.FromRuntime {
		t.Errorf("threshold removed: got %+v, want 30s from config, confirm_after still runtime", v)
	}
	if v, _, err = devs.SetType(ctx, "pump", func(shard.TypeSetting) shard.TypeSetting { return shard.TypeSetting{} }, nil); err != nil {
		t.Fatal(err)
	}
	if v.ThresholdFrom != shard.FromConfig || v.ConfirmAfterFrom != shard.FromConfig || v.ConfirmAfterMS != 5000 {
		t.Errorf("removed: got %+v, want both from config", v)
	}
	if got := thr.Type("valve"); got.ThresholdFrom != shard.FromDefault || got.ThresholdMS != 10_000 || got.ConfirmAfterFrom != shard.FromDefault {
		t.Errorf("a type without a setting: got %+v, want the default", got)
	}
	if got := thr.Types(); len(got) != 1 || got[0].Type != "pump" {
		t.Errorf("Types = %+v, want pump alone", got)
	}
}

// TestTypeThresholdMovesItsDevices: a type's new threshold moves the
// deadline of each watched device of that type by the change (lowered:
// never sooner than the new threshold from now), in every shard that may
// hold it while a doubling drains under an API whose topology lags it;
// devices with an override, of another type, or not watched are left as
// they are.
func TestTypeThresholdMovesItsDevices(t *testing.T) {
	ctx, s := newStore(t)
	if _, err := s.InitTopology(ctx, 4); err != nil {
		t.Fatal(err)
	}
	thr := shard.NewThresholds(s, 10*time.Second, map[string]time.Duration{"meter": 60 * time.Second})
	w, err := shard.NewWatcher(ctx, s, 4, time.Hour, nil) // never refreshed by a loop: it lags the doubling
	if err != nil {
		t.Fatal(err)
	}
	devs := shard.NewDevices(s, w, thr, nil)
	var meters []string
	for k := range 600 {
		meters = append(meters, fmt.Sprintf("m-%d", k))
	}
	moved := movedID(t, "mv", 4)
	meters = append(meters, moved)
	seenAs(t, s, "meter", meters...)
	seenAs(t, s, "meter", "own", "gone")
	seenAs(t, s, "pump", "pump-1")
	if _, err := devs.SetThreshold(ctx, "own", time.Hour); err != nil {
		t.Fatal(err)
	}
	last := time.Now().Add(time.Hour).UnixMilli() // far ahead: no move is held by "now"
	for _, id := range append(meters, "pump-1") {
		upsert(t, s, shard.Of(id, 4), shard.Entry{ID: id, Deadline: last + 60_000})
	}
	upsert(t, s, shard.Of("own", 4), shard.Entry{ID: "own", Deadline: last + 3_600_000})
	if _, err := s.Double(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	// A newer signal of the moved device, placed under 8 shards.
	upsert(t, s, shard.Of(moved, 8), shard.Entry{ID: moved, Deadline: last + 500 + 60_000})

	change := func(d time.Duration) int {
		t.Helper()
		_, n, err := devs.SetType(ctx, "meter", func(shard.TypeSetting) shard.TypeSetting { return shard.TypeSetting{Threshold: d} }, nil)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n, want := change(20*time.Second), len(meters)+1; n != want {
		t.Errorf("lowered 60s to 20s: %d deadlines moved, want %d (every meter, the moved one in both shards)", n, want)
	}
	for _, id := range meters[:len(meters)-1] {
		if got, _ := score(t, s, shard.Of(id, 4), id); got != last+20_000 {
			t.Fatalf("%s after lowering: got %d, want %d", id, got, last+20_000)
		}
	}
	for i, want := range map[int]int64{shard.Of(moved, 4): last + 20_000, shard.Of(moved, 8): last + 500 + 20_000} {
		if got, _ := score(t, s, i, moved); got != want {
			t.Errorf("moved device's copy in shard %d: got %d, want %d", i, got, want)
		}
	}
	for id, want := range map[string]int64{"own": last + 3_600_000, "pump-1": last + 60_000} {
		if got, _ := score(t, s, shard.Of(id, 4), id); got != want {
			t.Errorf("%s: got %d, want %d left alone", id, got, want)
		}
	}
	if got, ok := score(t, s, shard.Of("gone", 4), "gone"); ok {
		t.Errorf("unwatched device got deadline %d, want it left absent", got)
	}
	// Removing the setting goes back to the configuration's 60s.
	if _, _, err := devs.SetType(ctx, "meter", func(shard.TypeSetting) shard.TypeSetting { return shard.TypeSetting{} }, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := score(t, s, shard.Of("m-0", 8), "m-0"); got != last+60_000 {
		t.Errorf("m-0 after removing the setting: got %d, want %d", got, last+60_000)
	}
}

// TestLoweredTypeThresholdNeverSoonerThanItself: a device whose deadline
// is near keeps at least the new threshold from the change.
func TestLoweredTypeThresholdNeverSoonerThanItself(t *testing.T) {
	ctx, s, devs := newDevices(t, 4, time.Minute)
	seenAs(t, s, "meter", "a")
	before := time.Now().UnixMilli()
	upsert(t, s, shard.Of("a", 4), shard.Entry{ID: "a", Deadline: before + 50_000}) // last signal 10s ago
	if _, _, err := devs.SetType(ctx, "meter", func(shard.TypeSetting) shard.TypeSetting { return shard.TypeSetting{Threshold: 5 * time.Second} }, nil); err != nil {
		t.Fatal(err)
	}
	got, _ := score(t, s, shard.Of("a", 4), "a")
	if got < before+5_000 || got > time.Now().UnixMilli()+5_000 {
		t.Errorf("deadline after lowering to 5s: got %d, want 5s after the change (%d..%d)", got, before+5_000, time.Now().UnixMilli()+5_000)
	}
}
