package alarm

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// rateAlarms starts an alarm replica with policy p and the rate limits
// rate (per type) and total.
func (h *harness) rateAlarms(replica string, p Policy, rate, total float64) *Alarms {
	h.t.Helper()
	a, _ := h.alarmsWith(replica, p, func(o *Options) { o.Rate, o.RateTotal = rate, total })
	return a
}

// loseAll signals n devices prefix-00, prefix-01, ... of type typ once, so
// that all are lost together a threshold later, and returns their ids.
func (h *harness) loseAll(prefix, typ string, n int) []string {
	h.t.Helper()
	var ids []string
	for k := range n {
		ids = append(ids, fmt.Sprintf("%s-%02d", prefix, k))
	}
	for _, id := range ids {
		if err := h.in.Signal(h.ctx, id, typ, time.Now()); err != nil {
			h.t.Fatal(err)
		}
	}
	return ids
}

// stored is one notification as the stream stored it, with the stream's
// timestamp.
type storedNote struct {
	dispatch.Alarm
	MsgID   string
	Subject string
	Time    time.Time
}

// storedNotes returns the notifications the stream holds, in stream order.
func (h *harness) storedNotes() []storedNote {
	h.t.Helper()
	var out []storedNote
	for _, m := range testenv.StreamMessages(h.t, h.nc, "SIGWATCH", "sigwatch.alarm.") {
		n := storedNote{MsgID: m.Header.Get("Nats-Msg-Id"), Subject: m.Subject, Time: m.Time}
		if err := json.Unmarshal(m.Data, &n.Alarm); err != nil {
			h.t.Fatalf("notification %s: %v", m.Data, err)
		}
		out = append(out, n)
	}
	return out
}

// checkPaced checks that the notifications ns, as the stream stored them,
// came at the rate perSecond, over at least span. Slots are T =
// Spacing(perSecond) = 1.1s/perSecond apart, and a note is stored at its
// slot or up to late after it (its timer's lag and the publish): so any
// second of stream times [t, t+1s) holds only notes whose slots lie in
// [t-late, t+1s), at most ceil((1s+late)/T) of them. late is measured
// (notification_lateness_seconds, see latenessBound): up to 100 ms that is
// perSecond.
func checkPaced(t *testing.T, what string, ns []storedNote, perSecond int, late, span time.Duration) {
	t.Helper()
	T := Spacing(float64(perSecond))
	allowed := int((time.Second + late + T - 1) / T)
	var ts []time.Time
	for _, n := range ns {
		ts = append(ts, n.Time)
	}
	if len(ts) == 0 {
		t.Fatalf("%s: no notifications", what)
	}
	n, at := testenv.MaxInWindow(ts, time.Second)
	if n > allowed {
		t.Errorf("%s: %d notifications stored in the second from %s, want at most %d (%d a second, stored up to %v after their slots)",
			what, n, at.Format("15:04:05.000"), allowed, perSecond, late)
	}
	first, last := ts[0], ts[0]
	for _, x := range ts {
		if x.Before(first) {
			first = x
		}
		if x.After(last) {
			last = x
		}
	}
	// The slots span at least span; stored, the first may be up to late
	// after its slot and the last on time.
	if got := last.Sub(first); got < span-late {
		t.Errorf("%s: %d notifications stored over %v, want at least %v less %v", what, len(ts), got, span, late)
	}
	t.Logf("%s: %d notifications over %v, at most %d in a second, stored within %v of their slots", what, len(ts), last.Sub(first), n, late)
}

// latenessBound returns the least bucket bound of the alarms'
// notification_lateness_seconds that holds every observation.
func latenessBound(t *testing.T, as ...*Alarms) time.Duration {
	t.Helper()
	var bound float64
	for _, a := range as {
		var m dto.Metric
		if err := a.m.lateness.Write(&m); err != nil {
			t.Fatal(err)
		}
		h := m.GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetCumulativeCount() == h.GetSampleCount() {
				bound = max(bound, b.GetUpperBound())
				break
			}
		}
	}
	return time.Duration(bound * float64(time.Second))
}

// raisedOnce checks that every device of ids has exactly one raised, stored
// once, and returns the raised notifications.
func raisedOnce(t *testing.T, ns []storedNote, ids []string) []storedNote {
	t.Helper()
	byID := map[string]int{}
	var raised []storedNote
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	perDevice := map[string]int{}
	for _, n := range ns {
		byID[n.MsgID]++
		if n.State == Raised && want[n.Device] {
			perDevice[n.Device]++
			raised = append(raised, n)
		}
	}
	for id, k := range byID {
		if k != 1 {
			t.Errorf("notification %s stored %d times, want once", id, k)
		}
	}
	for _, id := range ids {
		if perDevice[id] != 1 {
			t.Errorf("device %s: %d raised, want 1", id, perDevice[id])
		}
	}
	return raised
}

// waitRaised waits until every device of ids has its raised.
func (h *harness) waitRaised(ids []string, timeout time.Duration) {
	h.t.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	h.notes.WaitN(h.t, timeout, len(ids), fmt.Sprintf("%d raised", len(ids)), func(n dispatch.Alarm) bool {
		return n.State == Raised && want[n.Device]
	})
}

// longPolicy repeats nothing within a test.
func longPolicy() Policy {
	return Policy{Interval: time.Hour, Backoff: 1, MaxInterval: time.Hour}
}

// TestRatePacesOneType proves alarm.rate: 50 devices of one type lost at
// once with a rate of 10 per second are all raised, once each, never more
// than 10 in a second, over at least 4.9s.
func TestRatePacesOneType(t *testing.T) {
	h := newHarness(t)
	a := h.rateAlarms("a", longPolicy(), 10, 0)
	ids := h.loseAll("pace", "meter", 50)
	h.waitRaised(ids, 30*time.Second)
	ns := h.storedNotes()
	raised := raisedOnce(t, ns, ids)
	checkPaced(t, "type meter", raised, 10, latenessBound(t, a), 4900*time.Millisecond)
	if d := testutil.ToFloat64(a.m.delayed.WithLabelValues("meter")); d < 40 {
		t.Errorf("notifications_delayed_total{type=meter} = %v, want at least 40 of 50", d)
	}
	if n := testenv.Observations(t, a.m.delay); n != 50 {
		t.Errorf("notification_delay_seconds observed %d times, want 50", n)
	}
}

// TestRatePacesPerSubject proves that alarm.rate paces what a consumer of a
// subject receives: with nats.max_types at 1, ten types share the subject
// sigwatch.alarm.other beyond the first, and that subject gets no more
// than the rate, not the rate for each type in it. The delayed counter's
// type label takes only the subject tokens.
func TestRatePacesPerSubject(t *testing.T) {
	h := newHarness(t)
	var err error
	if h.apub, err = dispatch.New(h.ctx, h.nc, dispatch.Options{AckWait: 2 * time.Second, MaxTypes: 1}); err != nil {
		t.Fatal(err)
	}
	a := h.rateAlarms("a", longPolicy(), 2, 0)
	var ids []string
	for k := range 10 {
		ids = append(ids, h.loseAll(fmt.Sprintf("sub%d", k), fmt.Sprintf("type%d", k), 2)...)
	}
	h.waitRaised(ids, 60*time.Second)
	raised := raisedOnce(t, h.storedNotes(), ids)
	bySubject := map[string][]storedNote{}
	for _, n := range raised {
		bySubject[n.Subject] = append(bySubject[n.Subject], n)
	}
	other := bySubject["sigwatch.alarm.other"]
	if len(other) < 16 || len(bySubject) != 2 {
		t.Fatalf("notifications by subject: %d subjects, %d on sigwatch.alarm.other; want 2 subjects, at least 16 of 20 on other", len(bySubject), len(other))
	}
	// The type seen first got the one subject of its own.
	tokens := map[string]bool{}
	for subj := range bySubject {
		tokens[strings.TrimPrefix(subj, "sigwatch.alarm.")] = true
	}
	checkPaced(t, "subject sigwatch.alarm.other", other, 2, latenessBound(t, a), time.Duration(len(other)-1)*Spacing(2))
	labels := map[string]bool{}
	ch := make(chan prometheus.Metric, 64)
	a.m.delayed.Collect(ch)
	close(ch)
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		for _, l := range d.GetLabel() {
			labels[l.GetValue()] = true
		}
	}
	for l := range labels {
		if !tokens[l] {
			t.Errorf("notifications_delayed_total has type label %q: labels must be subject tokens (%v)", l, tokens)
		}
	}
}

// TestRatePacesAcrossReplicas proves that the rate holds across alarm
// replicas sharing Redis: two replicas handle 40 devices lost at once at
// 10 per second between them.
func TestRatePacesAcrossReplicas(t *testing.T) {
	h := newHarness(t)
	a := h.rateAlarms("a", longPolicy(), 10, 0)
	b := h.rateAlarms("b", longPolicy(), 10, 0)
	ids := h.loseAll("pair", "meter", 40)
	h.waitRaised(ids, 30*time.Second)
	raised := raisedOnce(t, h.storedNotes(), ids)
	checkPaced(t, "two replicas", raised, 10, latenessBound(t, a, b), 3900*time.Millisecond)
	na := testutil.ToFloat64(a.m.notifications.WithLabelValues(Raised))
	nb := testutil.ToFloat64(b.m.notifications.WithLabelValues(Raised))
	if na == 0 || nb == 0 {
		t.Logf("raised published by a: %v, by b: %v (one replica did all)", na, nb)
	}
}

// TestRateTotalCapsAllTypes proves alarm.rate_total: two types at 10 per
// second each, and 15 per second in all, stay within both.
func TestRateTotalCapsAllTypes(t *testing.T) {
	h := newHarness(t)
	a := h.rateAlarms("a", longPolicy(), 10, 15)
	// The types come interleaved: a type whose slots run far ahead also
	// runs the total's ahead (see rate.go).
	var all []string
	for k := range 30 {
		all = append(all, h.loseAll(fmt.Sprintf("m%02d", k), "meter", 1)...)
		all = append(all, h.loseAll(fmt.Sprintf("t%02d", k), "tracker", 1)...)
	}
	h.waitRaised(all, 30*time.Second)
	raised := raisedOnce(t, h.storedNotes(), all)
	var m, tr []storedNote
	for _, n := range raised {
		if strings.HasPrefix(n.Device, "m") {
			m = append(m, n)
		} else {
			tr = append(tr, n)
		}
	}
	late := latenessBound(t, a)
	checkPaced(t, "all types", raised, 15, late, 59*time.Second/15)
	checkPaced(t, "type meter", m, 10, late, 0)
	checkPaced(t, "type tracker", tr, 10, late, 0)
}

// TestRateCoalescesRepeats proves that repeats of an alarm waiting for its
// slot are coalesced: at 2 notifications per second, 6 devices repeating
// every 300ms each get their raised, then repeats whose counts grow
// (skipping the coalesced ones), and the rate holds.
func TestRateCoalescesRepeats(t *testing.T) {
	h := newHarness(t)
	a := h.rateAlarms("a", policy(), 2, 0)
	ids := h.loseAll("co", "meter", 6)
	h.waitRaised(ids, 10*time.Second)
	// Each device's first repeat comes after the 6 raised (3s at 2/s); by
	// then each has decided about ten.
	h.notes.WaitN(t, 20*time.Second, 6, "a repeat of each device", func(n dispatch.Alarm) bool {
		return n.State == Repeat
	})
	ns := h.storedNotes()
	checkPaced(t, "type meter", ns, 2, latenessBound(t, a), 5*time.Second)
	jumped := 0
	for _, id := range ids {
		var mine []storedNote
		for _, n := range ns {
			if n.Device == id {
				mine = append(mine, n)
			}
		}
		if mine[0].State != Raised {
			t.Errorf("device %s: first notification %s, want raised", id, mine[0].State)
		}
		last := 0
		for _, n := range mine[1:] {
			if n.State != Repeat || n.Count <= last {
				t.Errorf("device %s: %s/%d after repeat %d, want a later repeat", id, n.State, n.Count, last)
			}
			if n.Count > last+1 {
				jumped++
			}
			last = n.Count
		}
	}
	if jumped == 0 {
		t.Errorf("no repeat skipped a count: want repeats waiting for a slot coalesced into one")
	}
	if c := testutil.ToFloat64(a.m.coalesced); c == 0 {
		t.Errorf("notifications_coalesced_total = 0, want > 0")
	}
	// Each alarm holds at most its one coalesced repeat.
	for _, id := range ids {
		st, err := a.load(h.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Pending) > 1 {
			t.Errorf("device %s: %d notifications pending, want at most 1", id, len(st.Pending))
		}
	}
}

// TestRateSlotKeptAcrossCrash proves that a note whose slot was stored
// before a crash (the replica died before publishing it) is published at
// that slot, not before even when an event flushes the state earlier, and
// once, without reserving another.
func TestRateSlotKeptAcrossCrash(t *testing.T) {
	h := newHarness(t)
	a := h.rateAlarms("a", longPolicy(), 10, 0)
	const id = "dev-crash"
	now := time.Now()
	since := now.Add(-time.Second).UnixMilli()
	slot := now.Add(1500 * time.Millisecond).UnixMilli()
	st := State{Version: 1, Phase: Active, Type: "meter", Since: since, Deadline: since, Next: now.Add(time.Hour).UnixMilli(),
		Last: Raised, At: now.UnixMilli(), Pending: []Note{{Slot: slot, Alarm: dispatch.Alarm{
			ID: NoteID(id, since, Raised, 0), Device: id, Type: "meter", State: Raised, Since: since, At: now.UnixMilli()}}}}
	b, _ := json.Marshal(st)
	if ok, err := a.swapState(h.ctx, id, "", string(b), true); err != nil || !ok {
		t.Fatalf("write the state left by the crash: %v %v", ok, err)
	}
	if err := a.arm(h.ctx, id, slot, now); err != nil {
		t.Fatal(err)
	}
	// A redelivered lost event flushes the state before the slot: the note
	// waits.
	ev := dispatch.Lost{ID: dispatch.LostID(id, since), Device: id, Type: "meter", Deadline: since, FiredAt: since}
	msg, _ := dispatch.Encode(dispatch.Subjects{}, ev)
	msg.ID += "/again"
	if err := h.pub.Publish(h.ctx, []dispatch.Message{msg})[0]; err != nil {
		t.Fatal(err)
	}
	testenv.Never(t, time.Until(time.UnixMilli(slot))-200*time.Millisecond, "the raised published before its slot", func() bool {
		return len(h.notesOf(id)) > 0
	})
	n := h.wait(id, Raised, "", 5*time.Second)
	if n.At.UnixMilli() < slot {
		t.Errorf("raised received at %d, before its slot %d", n.At.UnixMilli(), slot)
	}
	stored := h.storedNotes()
	if len(stored) != 1 || stored[0].Time.UnixMilli() < slot {
		t.Errorf("stream holds %d notifications (first at %v), want the one raised, stored at or after its slot %d", len(stored), stored, slot)
	}
	// No slot was reserved for it: the type's pace starts at now.
	at := time.Now().UnixMilli()
	got, err := a.reserveSlots(h.ctx, at, []string{"meter"}, 100*time.Millisecond, 0)
	if err != nil || got[0] != at {
		t.Errorf("next slot of type meter = %v (%v), want now %d: the stored slot was reused, none reserved", got, err, at)
	}
	if v, _, _ := a.Get(h.ctx, id); v.State != Raised {
		t.Errorf("alarm = %+v, want raised", v)
	}
}
