package guard_test

import (
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestRestorePutsTypeThresholdsBack: after Redis comes back empty, the
// thresholds set at run time per type are in force again, in Redis and in
// the process, and a device of such a type is re-armed a full threshold of
// its type as it was set, not as the configuration says.
func TestRestorePutsTypeThresholdsBack(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	g := r.guard(t)
	r.add(t, []dispatch.DeviceRecord{{ID: "m1", Type: "meter"}, {ID: "p1", Type: "pump"}})
	for _, rec := range []dispatch.TypeRecord{{Type: "meter", Threshold: 10 * 60_000}, {Type: "pump", Confirm: 0, ConfirmSet: true}} {
		if err := r.reg.PutType(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	stop := r.run(t, g)
	defer stop()
	r.empty(t)
	start := time.Now()
	testenv.WaitFor(t, 20*time.Second, "the restore", func() bool {
		ok, _ := g.Ready()
		gen, found, err := r.store.Beat(ctx, time.Now().UnixMilli())
		return ok && found && err == nil && gen.ID == r.store.Generation()
	})
	if got := r.thr.For("m1", "meter"); got != 10*time.Minute {
		t.Errorf("meter's threshold after the restore: got %v, want the run-time 10m", got)
	}
	other := shard.NewThresholds(r.store, time.Minute, map[string]time.Duration{"meter": 2 * time.Minute})
	other.Confirm = map[string]time.Duration{"pump": time.Minute}
	if err := other.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if v := other.Type("meter"); v.ThresholdFrom != shard.FromRuntime || v.ThresholdMS != 600_000 {
		t.Errorf("meter in Redis after the restore: got %+v, want 10m from runtime", v)
	}
	if v := other.Type("pump"); v.ConfirmAfterFrom != shard.FromRuntime || v.ConfirmAfterMS != 0 || v.ThresholdFrom != shard.FromDefault {
		t.Errorf("pump in Redis after the restore: got %+v, want confirm_after 0s from runtime", v)
	}
	topo, err := r.store.Topology(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dl, ok := r.deadline(t, topo, "m1")
	if min := start.Add(10 * time.Minute).UnixMilli(); !ok || dl < min {
		t.Errorf("m1 re-armed at %d (watched %v), want at least %d: a full run-time threshold from the restore", dl, ok, min)
	}
}

// TestRestoreOutageCoversRunTimeTypes: a process that starts on a Redis
// that lost its data, with nothing to say when the data was last whole,
// counts the outage back by the longest threshold in force — a type's set
// at run time included, which only the restore brings back.
func TestRestoreOutageCoversRunTimeTypes(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	r.guard(t)
	if err := r.reg.PutType(ctx, dispatch.TypeRecord{Type: "meter", Threshold: 10 * 60_000}); err != nil {
		t.Fatal(err)
	}
	r.empty(t)
	r.thr = shard.NewThresholds(r.store, time.Minute, map[string]time.Duration{"meter": 2 * time.Minute})
	r.guard(t)
	restored := time.Now()
	_, outages, err := r.store.Watermarks().Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := restored.Add(-10 * time.Minute).UnixMilli()
	for _, o := range outages {
		if o.Start <= want {
			return
		}
	}
	t.Errorf("outages %+v after the restore; want one from %d: 10m, meter's run-time threshold, before the restore", outages, want)
}
