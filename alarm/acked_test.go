package alarm

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestAckOfMutedAlarmIsSuppressed: the acked of a muted device is decided
// as muted, like its other notes, and never published, not even once the
// mute is gone; the repeats after the ack's end carry on from the count
// underneath.
func TestAckOfMutedAlarmIsSuppressed(t *testing.T) {
	h := newHarness(t)
	a, _ := h.alarms("a", policy())
	h.signal("dev-hush", "")
	h.wait("dev-hush", Raised, "", 5*time.Second)
	m, err := a.AddMute(h.ctx, Mute{Device: "dev-hush", Until: time.Now().Add(time.Hour).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Second)
	v, err := a.Ack(h.ctx, "dev-hush", until, "")
	if err != nil || v.State != Acked || v.Last != Acked {
		t.Fatalf("ack until of the muted device: %+v, %v; want acked, its acked decided", v, err)
	}
	suppressed := a.m.suppressed.WithLabelValues(Acked)
	testenv.WaitFor(t, 2*time.Second, "the acked suppressed", func() bool { return testutil.ToFloat64(suppressed) == 1 })
	if ok, err := a.RemoveMute(h.ctx, m.ID); !ok || err != nil {
		t.Fatalf("remove mute: %v %v", ok, err)
	}
	h.notes.Wait(t, 3*time.Second, "a repeat after the ack's end", func(n dispatch.Alarm) bool {
		return n.Device == "dev-hush" && n.State == Repeat && n.Count > v.Count && n.At >= until.UnixMilli()
	})
	if gs := h.notes.Where(func(n dispatch.Alarm) bool { return n.Device == "dev-hush" && n.State == Acked }); len(gs) != 0 {
		t.Errorf("muted ack published: %v", states(gs))
	}
	if n := testutil.ToFloat64(a.m.notifications.WithLabelValues(Acked)); n != 0 {
		t.Errorf("%v acked counted as notified, want 0", n)
	}
}

// TestScopeAckNotifies: a group's storm alarm acked with an end says acked
// once, with no device and the group, pauses its repeats and resumes them
// after the end.
func TestScopeAckNotifies(t *testing.T) {
	h := newHarness(t)
	var dark, rest []ingest.Sig
	for k := range 10 {
		s := ingest.Sig{ID: fmt.Sprintf("gwa-%d", k), Group: "gwa"}
		if k < 6 {
			dark = append(dark, s)
		} else {
			rest = append(rest, s)
		}
	}
	for k := range 40 {
		rest = append(rest, ingest.Sig{ID: fmt.Sprintf("calm-%d", k), Group: "calm"})
	}
	h.keepAliveSigs(rest)
	stopDark := h.keepAliveSigs(dark)
	a, _ := h.alarmsWith("r1", policy(), stormOptions(50))
	time.Sleep(300 * time.Millisecond)
	stopDark()
	ofGroup := func(n dispatch.Alarm) bool { return n.Device == "" && n.Group == "gwa" }
	raised := h.notes.Wait(t, 20*time.Second, "the gwa alarm raised", func(n dispatch.Alarm) bool {
		return ofGroup(n) && n.State == Raised
	})
	until := time.Now().Add(1200 * time.Millisecond)
	v, err := a.AckScope(h.ctx, "gwa", until, "")
	if err != nil || v.State != Acked || v.Group != "gwa" {
		t.Fatalf("ack of the gwa alarm: %+v, %v; want acked", v, err)
	}
	ack := h.notes.Wait(t, 2*time.Second, "the gwa alarm acked", func(n dispatch.Alarm) bool { return ofGroup(n) && n.State == Acked })
	if want := NoteID(ScopeAlarmID(StormScope("gwa")), raised.Body.Since, Acked, v.Count); ack.MsgID != want ||
		ack.Body.ID != want || ack.Body.Count != v.Count || ack.Body.Type != raised.Body.Type {
		t.Errorf("acked = %+v (msg id %q), want id %s, count %d, the raise's type", ack.Body, ack.MsgID, want, v.Count)
	}
	testenv.Never(t, time.Until(until)-100*time.Millisecond, "a repeat of the gwa alarm while acked", func() bool {
		return len(h.notes.Where(func(n dispatch.Alarm) bool { return ofGroup(n) && n.Count > v.Count })) > 0
	})
	h.notes.Wait(t, 3*time.Second, "the gwa alarm's repeats resumed", func(n dispatch.Alarm) bool {
		return ofGroup(n) && n.State == Repeat && n.Count == v.Count+1 && n.At >= until.UnixMilli()
	})
	if gs := h.notes.Where(func(n dispatch.Alarm) bool { return ofGroup(n) && n.State == Acked }); len(gs) != 1 {
		t.Errorf("the gwa alarm acked %d times, want once", len(gs))
	}
	for _, s := range dark {
		if gs := h.notesOf(s.ID); len(gs) != 0 {
			t.Errorf("%s notified during its group's storm: %v", s.ID, states(gs))
		}
	}
}

// TestStormDevices: a storm of 300 devices of one group lists them, the
// earliest lost first up to the limit, sorted, with the total; the fleet's
// storm counts the same devices; a scope that never had one has none. The
// fleet's alarm acked with an end says acked with neither device nor
// group.
func TestStormDevices(t *testing.T) {
	const n = 300
	h := newHarness(t)
	a, _ := h.alarmsWith("r1", policy(), stormOptions(5))
	var sigs []ingest.Sig
	var want []string
	for k := range n {
		sigs = append(sigs, ingest.Sig{ID: fmt.Sprintf("big-%03d", k), Group: "big"})
		want = append(want, sigs[k].ID)
	}
	if err := h.in.Signals(h.ctx, sigs); err != nil {
		t.Fatal(err)
	}
	big := StormScope("big")
	testenv.WaitFor(t, 30*time.Second, "300 lost devices in the big storm", func() bool {
		_, total, err := a.StormDevices(h.ctx, big, 0)
		return err == nil && total == n
	})
	all, total, err := a.StormDevices(h.ctx, big, 1000)
	if err != nil || total != n || !slices.Equal(all, want) {
		t.Fatalf("StormDevices(%s, 1000) = %d devices (first %v), total %d, %v; want the %d, sorted", big, len(all), all[:min(len(all), 3)], total, err, n)
	}
	some, total, err := a.StormDevices(h.ctx, big, 25)
	if err != nil || total != n || len(some) != 25 || !slices.IsSorted(some) {
		t.Fatalf("StormDevices(%s, 25) = %v, total %d, %v; want 25 sorted of %d", big, some, total, err, n)
	}
	for _, d := range some {
		if _, ok := slices.BinarySearch(want, d); !ok {
			t.Errorf("StormDevices lists %s, not one of the storm's", d)
		}
	}
	if again, _, _ := a.StormDevices(h.ctx, big, 25); !slices.Equal(again, some) {
		t.Errorf("StormDevices twice: %v then %v, want the same", some, again)
	}
	if none, total, err := a.StormDevices(h.ctx, big, 0); err != nil || total != n || none == nil || len(none) != 0 {
		t.Errorf("StormDevices(limit 0) = %v, %d, %v; want no devices, the total", none, total, err)
	}
	if fleet, total, err := a.StormDevices(h.ctx, StormScope(""), 10); err != nil || total != n || len(fleet) != 10 {
		t.Errorf("StormDevices(fleet, 10) = %v, %d, %v; want 10 of %d", fleet, total, err, n)
	}
	if none, total, err := a.StormDevices(h.ctx, StormScope("nope"), 10); err != nil || total != 0 || none == nil || len(none) != 0 {
		t.Errorf("StormDevices of an unknown scope = %v, %d, %v; want empty, 0, nil", none, total, err)
	}

	fleetRaised := h.notes.Wait(t, 20*time.Second, "the fleet alarm raised", func(n dispatch.Alarm) bool {
		return n.Device == "" && n.Group == "" && n.State == Raised
	})
	v, err := a.AckScope(h.ctx, "", time.Now().Add(time.Hour), "")
	if err != nil || v.State != Acked || v.Scope != dispatch.ScopeFleet {
		t.Fatalf("ack of the fleet alarm: %+v, %v; want acked", v, err)
	}
	ack := h.notes.Wait(t, 2*time.Second, "the fleet alarm acked", func(n dispatch.Alarm) bool {
		return n.Device == "" && n.Group == "" && n.State == Acked
	})
	if want := NoteID(ScopeAlarmID(StormScope("")), fleetRaised.Body.Since, Acked, v.Count); ack.MsgID != want {
		t.Errorf("fleet acked id %q, want %s", ack.MsgID, want)
	}
}
