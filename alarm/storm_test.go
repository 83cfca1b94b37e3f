package alarm

import (
	"fmt"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// stormOptions turn storms on with short windows for a test.
func stormOptions(fleetMin int) func(*Options) {
	return func(o *Options) {
		o.Storm = DefaultStormConfig()
		o.Storm.FleetMin, o.Storm.GroupMin = fleetMin, 3
		o.Storm.Window, o.Storm.Hold = 2*time.Second, time.Second
	}
}

// TestFleetStormHoldsDeviceAlarms silences 12 of 30 devices at once: more
// than a fifth of the fleet, so one fleet storm starts, one fleet alarm is
// raised, and none of the 12 gets an alarm of its own; when they come back
// the storm ends and the fleet alarm is resolved.
//
// The other 18, and the 12 once back, are steady devices, which a stalled
// test process does not lose; the 12 signal once, in one batch, and go
// silent: a keep-alive of the short threshold could lose them early. The
// hold is 4s: the storm must take in every held alarm within it, and on a
// loaded machine the scanner's shards can fire the 12 losses more than a
// second apart.
func TestFleetStormHoldsDeviceAlarms(t *testing.T) {
	const hold = 4 * time.Second
	h := newHarness(t)
	storms := testenv.RecordStream[dispatch.Storm](t, h.nc, "SIGWATCH", "sigwatch.storm")
	var live, silent []string
	var once []ingest.Sig
	for k := range 30 {
		id := fmt.Sprintf("fs-%02d", k)
		if k < 12 {
			silent = append(silent, id)
			once = append(once, ingest.Sig{ID: id})
		} else {
			live = append(live, id)
		}
	}
	h.keepAlive(steady, live...)
	h.alarmsWith("r1", policy(), func(o *Options) {
		stormOptions(5)(o)
		o.Storm.Hold = hold
	})
	if err := h.in.Signals(h.ctx, once); err != nil {
		t.Fatal(err)
	}

	started := storms.Wait(t, 20*time.Second, "fleet storm started", func(s dispatch.Storm) bool { return s.State == StormStarted })
	// A device being marked lost counts in its shard and in the lost
	// marks for a moment: the fleet's count may run over by those.
	if s := started.Body; s.Scope != dispatch.ScopeFleet || s.Group != "" || s.Watched < 30 || s.Watched > 42 ||
		s.Devices < 7 || s.ID != started.MsgID {
		t.Errorf("started = %+v (msg id %q), want scope fleet, 30 watched (up to 12 being marked lost counted twice), at least 7 lost, id = msg id", s, started.MsgID)
	}
	raised := h.notes.Wait(t, 20*time.Second, "fleet alarm raised", func(n dispatch.Alarm) bool {
		return n.Device == "" && n.State == Raised
	})
	if raised.Body.Group != "" {
		t.Errorf("fleet alarm group %q, want none", raised.Body.Group)
	}
	time.Sleep(hold + 2*time.Second) // past every hold
	for _, id := range silent {
		if n := h.notesOf(id); len(n) > 0 {
			t.Errorf("%s: %d notifications during the fleet storm, want none: %v", id, len(n), states(n))
		}
	}

	h.keepAlive(steady, silent...)
	storms.Wait(t, 20*time.Second, "fleet storm ended", func(s dispatch.Storm) bool { return s.State == StormEnded })
	h.notes.Wait(t, 20*time.Second, "fleet alarm resolved", func(n dispatch.Alarm) bool {
		return n.Device == "" && n.State == Resolved
	})
	// A device still lost when the storm ended gets the hold again: past it.
	time.Sleep(hold + time.Second)
	for _, id := range silent {
		if n := h.notesOf(id); len(n) > 0 {
			t.Errorf("%s: %d notifications, want none: %v", id, len(n), states(n))
		}
	}
	if n := storms.Len(); n != 2 {
		t.Errorf("%d storm events, want 2 (started, ended)", n)
	}
}

// TestFewLostAreOrdinaryAlarms: 3 of 30 lost is no storm; each is raised
// after the hold. The 27 others are steady devices, so that a stalled test
// process loses none of them and makes a storm of its own.
func TestFewLostAreOrdinaryAlarms(t *testing.T) {
	h := newHarness(t)
	storms := testenv.RecordStream[dispatch.Storm](t, h.nc, "SIGWATCH", "sigwatch.storm")
	var live []string
	for k := range 27 {
		live = append(live, fmt.Sprintf("ok-%02d", k))
	}
	h.keepAlive(steady, live...)
	h.alarmsWith("r1", policy(), stormOptions(5))
	ids := h.raiseAll("few", 3)
	start := time.Now()
	h.waitAll(ids, Raised, "", 30*time.Second)
	if d := time.Since(start); d < threshold+time.Second-200*time.Millisecond {
		t.Errorf("raised %v after the last signal, want after the threshold and the 1s hold", d)
	}
	if n := storms.Len(); n != 0 {
		t.Errorf("%d storm events, want none", n)
	}
}

func TestStormConfigRefusesNonsense(t *testing.T) {
	if err := DefaultStormConfig().Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	for name, c := range map[string]func(*StormConfig){
		"group fraction 0":   func(c *StormConfig) { c.GroupFraction = 0 },
		"group fraction 1.5": func(c *StormConfig) { c.GroupFraction = 1.5 },
		"fleet fraction 1":   func(c *StormConfig) { c.FleetFraction = 1 },
		"group min 0":        func(c *StormConfig) { c.GroupMin = 0 },
		"negative hold":      func(c *StormConfig) { c.Hold = -time.Second },
	} {
		cfg := DefaultStormConfig()
		c(&cfg)
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestStormNeed(t *testing.T) {
	c := DefaultStormConfig()
	for _, tc := range []struct {
		sc      string
		watched int64
		want    int64
	}{
		{"group:g", 100, 50}, {"group:g", 101, 51}, {"group:g", 6, 5}, {"group:g", 3, 5},
		{fleetScope, 1000, 201}, {fleetScope, 30, 10},
	} {
		if got := c.need(tc.sc, tc.watched); got != tc.want {
			t.Errorf("need(%s, %d) = %d, want %d", tc.sc, tc.watched, got, tc.want)
		}
	}
}

// TestLossCountedAfterItsRecoveryIsTakenBack replays a device lost and back
// within milliseconds, its two events handled by two workers: the lost
// handler read the device lost, the recovered handler then ran to the end
// and took it out of no storm count (it was not in one yet), and only then
// did the lost handler count the loss. The device, live, must not stay
// counted in its group's or the fleet's lost devices.
func TestLossCountedAfterItsRecoveryIsTakenBack(t *testing.T) {
	h := newHarness(t)
	a, _ := h.alarmsWith("r1", policy(), stormOptions(5))
	ctx := h.ctx
	lostAt := time.Now().Add(-time.Second).UnixMilli()
	// Back: its deadline is later than the one it was lost at.
	if err := h.in.Signals(ctx, []ingest.Sig{{ID: "blink", Group: "gw"}}); err != nil {
		t.Fatal(err)
	}
	if err := (events{a}).Recovered(ctx, dispatch.Recovered{ID: dispatch.RecoveredID("blink", lostAt), Device: "blink",
		Group: "gw", LostAt: lostAt, RecoveredAt: time.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	lost := dispatch.Lost{ID: dispatch.LostID("blink", lostAt), Device: "blink", Group: "gw", Deadline: lostAt}
	if err := a.stormLoss(ctx, lost, 0, dispatch.Fence{}); err != nil { // 0: read while the device was lost
		t.Fatal(err)
	}
	for _, sc := range scopesOf("gw") {
		if n, err := a.lostSince(ctx, sc, 0); err != nil || n != 0 {
			t.Errorf("scope %s counts %d lost devices (%v) after the device came back, want 0", sc, n, err)
		}
	}
}

// TestStormViewIsLive: a storm's view shows its group's lost and watched
// devices now, not at its start, and the device alarms it holds. Five of a
// gateway's ten devices go dark and start its storm; three more follow:
// the view says 8 lost of 10 (and 5 at the start), and, once the open
// alarms are counted, 8 held under the storm, none waiting.
func TestStormViewIsLive(t *testing.T) {
	h := newHarness(t)
	var first, second, rest []ingest.Sig
	for k := range 10 {
		s := ingest.Sig{ID: fmt.Sprintf("gwd-%d", k), Group: "gwd"}
		switch {
		case k < 5:
			first = append(first, s)
		case k < 8:
			second = append(second, s)
		default:
			rest = append(rest, s)
		}
	}
	for k := range 40 {
		rest = append(rest, ingest.Sig{ID: fmt.Sprintf("other-%d", k), Group: "other"})
	}
	alive := func(sigs ...[]ingest.Sig) func() {
		var all []ingest.Sig
		for _, s := range sigs {
			all = append(all, s...)
		}
		return h.keepAliveSigs(all)
	}
	alive(rest)
	stopSecond := alive(second)
	stopFirst := alive(first)
	a, _ := h.alarmsWith("r1", policy(), stormOptions(50))
	time.Sleep(300 * time.Millisecond)
	stopFirst()
	var v StormView
	testenv.WaitFor(t, 10*time.Second, "the gwd storm", func() bool {
		ss, err := a.Storms(h.ctx, 10)
		if err != nil || len(ss) == 0 {
			return false
		}
		v = ss[0]
		return v.Group == "gwd" && v.State == StormActive
	})
	start := v.Devices
	stopSecond()
	testenv.WaitFor(t, 10*time.Second, "8 of 10 lost, 8 held under the storm", func() bool {
		ss, err := a.Storms(h.ctx, 10)
		if err != nil || len(ss) != 1 {
			return false
		}
		v = ss[0]
		return v.Lost == 8 && v.Held == 8
	})
	if v.Size != 10 || v.Devices != start || v.Watched != 10 {
		t.Errorf("storm view %+v, want size 10 now, and %d of 10 at its start", v, start)
	}
	_, held, err := a.count(h.ctx)
	if err != nil || len(held) != 1 || held[groupScope("gwd")] != 8 {
		t.Errorf("held by storm %v (%v), want only 8 under group:gwd", held, err)
	}
	rows, _, err := a.List(h.ctx, Query{State: ListHeld, Group: "gwd"})
	if err != nil || len(rows) != 8 {
		t.Errorf("held alarms of group gwd: %d rows (%v), want 8", len(rows), err)
	}
	if rows, _, err := a.List(h.ctx, Query{State: ListHeld, Group: "other"}); err != nil || len(rows) != 0 {
		t.Errorf("held alarms of group other: %d rows (%v), want none", len(rows), err)
	}
}
