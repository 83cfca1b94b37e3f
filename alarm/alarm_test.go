package alarm

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/scanner"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
)

const (
	threshold = 500 * time.Millisecond
	interval  = 300 * time.Millisecond
	// steady is the type of devices that only fill a fleet: kept alive
	// every 100ms, they are lost only if the test process stalls for
	// steadyThreshold, which a loaded machine does not do.
	steady          = "steady"
	steadyThreshold = 10 * time.Second
)

// harness is one test's pipeline on real Redis and NATS: ingest (signals
// through Signal, the watermark moved by the harness), a deadline scanner
// publishing lost events, and any number of alarm replicas.
type harness struct {
	t      *testing.T
	ctx    context.Context
	nc     *nats.Conn
	store  *shard.Store
	topo   *shard.Watcher
	timers *shard.Store
	rtopo  *shard.Watcher
	pub    *dispatch.Bus
	// apub, when set, is the publisher alarm replicas get instead of pub.
	apub *dispatch.Bus
	js   jetstream.JetStream
	in   *ingest.Ingest
	log  *slog.Logger
	// notes are the alarm notifications and recovered events stored in the
	// stream, in stream order.
	notes     *testenv.Recorder[dispatch.Alarm]
	recovered *testenv.Recorder[dispatch.Recovered]
	// clock, in a harness from newSteppedHarness, is the alarms' clock: the
	// test steps time through repeat intervals instead of sleeping them out.
	// Deadlines, signals and the scanner stay on the wall clock; the
	// watermark the harness plays follows whichever is later.
	clock *testenv.Clock
	stops []func()
}

// newHarness is a harness whose alarms run on the wall clock.
func newHarness(t *testing.T) *harness {
	t.Helper()
	return harnessWith(t, nil)
}

// newSteppedHarness is a harness whose alarms run on a manual clock, set to
// the wall clock's time now.
func newSteppedHarness(t *testing.T) *harness {
	t.Helper()
	return harnessWith(t, testenv.NewClock(time.Now()))
}

func harnessWith(t *testing.T, clock *testenv.Clock) *harness {
	t.Helper()
	env := testenv.New(t, testenv.Options{NATS: true})
	ctx := context.Background()
	h := &harness{t: t, ctx: ctx, store: env.Store(t, "sw"), clock: clock}
	h.timers = h.store.Sub("alarm")
	h.log = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	var err error
	if h.topo, err = shard.NewWatcher(ctx, h.store, 4, 100*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	if h.rtopo, err = shard.NewWatcher(ctx, h.timers, 4, 100*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	h.nc = env.Conn(t, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if h.pub, err = dispatch.New(ctx, h.nc, dispatch.Options{AckWait: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if h.js, err = jetstream.New(h.nc); err != nil {
		t.Fatal(err)
	}
	thr := shard.NewThresholds(h.store, threshold, map[string]time.Duration{steady: steadyThreshold})
	if h.in, err = ingest.New(ingest.Options{ClientID: "alarm-test", Thresholds: thr}, h.store, h.topo, h.pub, nil, nil); err != nil {
		t.Fatal(err)
	}
	h.notes = testenv.RecordStream[dispatch.Alarm](t, h.nc, "SIGWATCH", "sigwatch.alarm.>")
	h.recovered = testenv.RecordStream[dispatch.Recovered](t, h.nc, "SIGWATCH", "sigwatch.recovered.>")
	before := testenv.IgnoreCurrent()

	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { h.topo.Run(runCtx) })
	wg.Go(func() { h.rtopo.Run(runCtx) })
	wg.Go(func() { _ = h.in.Run(runCtx) })
	wg.Go(func() { h.playWatermark(runCtx) })
	sc, err := scanner.New(scanner.Options{Replica: "deadlines", Thresholds: thr,
		Config: queue.Config{LeaseTTL: time.Second, Poll: 10 * time.Millisecond}, Rebalance: 100 * time.Millisecond}, h.store, h.topo, h.pub, nil, h.log)
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { _ = sc.Run(runCtx) })
	t.Cleanup(func() {
		for _, stop := range slices.Backward(h.stops) {
			stop()
		}
		cancel()
		wg.Wait()
		testenv.VerifyNone(t, before)
	})
	return h
}

// playWatermark plays ingest's watermark: every 5ms it moves it to the wall
// clock, or to the alarms' clock once that is ahead.
func (h *harness) playWatermark(ctx context.Context) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		now := time.Now()
		if h.clock != nil && h.clock.Now().After(now) {
			now = h.clock.Now()
		}
		_, _ = h.store.Watermarks().Advance(ctx, now.UnixMilli(), time.Hour)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// alarms starts an alarm replica with policy p and returns the function
// that stops it (the test's cleanup stops it too).
func (h *harness) alarms(replica string, p Policy) (*Alarms, func()) {
	h.t.Helper()
	return h.alarmsWith(replica, p, nil)
}

// alarmsWith is alarms with options changed by with (if not nil).
func (h *harness) alarmsWith(replica string, p Policy, with func(*Options)) (*Alarms, func()) {
	h.t.Helper()
	opts := Options{Policy: p, Replica: replica, AckWait: 2 * time.Second,
		Engine: queue.Config{LeaseTTL: time.Second, Poll: 10 * time.Millisecond}, Rebalance: 100 * time.Millisecond, DrainCheck: 200 * time.Millisecond,
		CountEvery: 100 * time.Millisecond}
	if with != nil {
		with(&opts)
	}
	if h.clock != nil {
		opts.Now = h.clock.Now
	}
	pub := h.pub
	if h.apub != nil {
		pub = h.apub
	}
	a, err := New(opts, h.store, h.topo, h.timers, h.rtopo, pub, nil, h.log.With("replica", replica))
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(h.ctx)
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					h.t.Errorf("alarm replica %s: Run returned %v, want nil", replica, err)
				}
			case <-time.After(15 * time.Second):
				h.t.Errorf("alarm replica %s: Run did not return within 15s of cancellation", replica)
			}
		})
	}
	h.stops = append(h.stops, stop)
	// The consumer exists once Run has created it; events before are not
	// for this test's alarms.
	testenv.WaitFor(h.t, 10*time.Second, "the alarm consumer", func() bool {
		_, err := h.js.Consumer(h.ctx, "SIGWATCH", "sigwatch-alarm")
		return err == nil
	})
	return a, stop
}

// signal sends one signal of device id (of type typ) and returns when it is
// stored.
func (h *harness) signal(id, typ string) time.Time {
	h.t.Helper()
	at := time.Now()
	if err := h.in.Signal(h.ctx, id, typ, at); err != nil {
		h.t.Fatal(err)
	}
	return at
}

// keepAlive signals ids every 100ms until the returned function is called.
// The ids go in one batch: one by one, a round of many could outlast the
// threshold on a loaded machine.
func (h *harness) keepAlive(typ string, ids ...string) (stop func()) {
	sigs := make([]ingest.Sig, len(ids))
	for k, id := range ids {
		sigs[k] = ingest.Sig{ID: id, Type: typ}
	}
	return h.keepAliveSigs(sigs)
}

// keepAliveSigs is keepAlive for signals with their groups.
func (h *harness) keepAliveSigs(sigs []ingest.Sig) (stop func()) {
	return h.every(func(ctx context.Context) { _ = h.in.Signals(ctx, sigs) })
}

// every runs send every 100ms until the returned function is called.
func (h *harness) every(send func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			send(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	h.stops = append(h.stops, stop)
	return stop
}

// note is one notification as the stream stored it.
type note = testenv.Event[dispatch.Alarm]

// about matches the notifications about device id.
func about(id string) func(dispatch.Alarm) bool {
	return func(n dispatch.Alarm) bool { return n.Device == id }
}

// notesOf returns the notifications about device id, in stream order.
func (h *harness) notesOf(id string) []note { return h.notes.Where(about(id)) }

// wait waits until device id has a notification in state (and reason, if
// not empty), and returns it.
func (h *harness) wait(id, state, reason string, timeout time.Duration) note {
	h.t.Helper()
	return h.notes.Wait(h.t, timeout, fmt.Sprintf("%s %s/%s", id, state, reason), func(n dispatch.Alarm) bool {
		return n.Device == id && n.State == state && (reason == "" || n.Reason == reason)
	})
}

// raiseAll signals n devices named prefix-00, prefix-01, ... once, so that
// each is lost a threshold later, and returns their ids.
func (h *harness) raiseAll(prefix string, n int) []string {
	h.t.Helper()
	var ids []string
	for k := range n {
		ids = append(ids, fmt.Sprintf("%s-%02d", prefix, k))
		h.signal(ids[k], "")
	}
	return ids
}

// waitAll waits until every device of ids has a notification in state (and
// reason, if not empty).
func (h *harness) waitAll(ids []string, state, reason string, timeout time.Duration) {
	h.t.Helper()
	for _, id := range ids {
		h.wait(id, state, reason, timeout)
	}
}

// recoverAll signals every device of ids again and waits until each alarm
// is resolved/recovered.
func (h *harness) recoverAll(ids []string) {
	h.t.Helper()
	for _, id := range ids {
		h.signal(id, "")
	}
	h.waitAll(ids, Resolved, ReasonRecovered, 5*time.Second)
}

// stepAll moves the alarms' clock on by the interval and waits until every
// device of ids has repeat k.
func (h *harness) stepAll(ids []string, k int) {
	h.t.Helper()
	h.clock.Advance(interval)
	for _, id := range ids {
		h.notes.Wait(h.t, 10*time.Second, fmt.Sprintf("repeat %d of %s", k, id), func(n dispatch.Alarm) bool {
			return n.Device == id && n.State == Repeat && n.Count == k
		})
	}
}

// stepToRepeat moves the alarms' clock to the next repeat of device id's
// alarm, after checking that nothing comes a millisecond before it, and
// returns the repeat.
func (h *harness) stepToRepeat(a *Alarms, id string) note {
	h.t.Helper()
	v, ok, err := a.Get(h.ctx, id)
	if err != nil || !ok || v.Next == 0 {
		h.t.Fatalf("alarm of %s: got %+v (present %v, %v), want a repeat to come", id, v, ok, err)
	}
	n := len(h.notesOf(id))
	h.clock.Set(time.UnixMilli(v.Next - 1))
	testenv.Never(h.t, 50*time.Millisecond, fmt.Sprintf("a notification of %s a millisecond before its repeat", id), func() bool {
		return len(h.notesOf(id)) > n
	})
	h.clock.Set(time.UnixMilli(v.Next))
	return h.notes.Wait(h.t, 5*time.Second, fmt.Sprintf("repeat %d of %s", v.Count+1, id), func(n dispatch.Alarm) bool {
		return n.Device == id && n.State == Repeat && n.Count == v.Count+1
	})
}

// states returns the state/count sequence of id's notifications.
func states(gs []note) []string {
	out := make([]string, len(gs))
	for j, g := range gs {
		out[j] = fmt.Sprintf("%s/%d", g.Body.State, g.Body.Count)
		if g.Body.Reason != "" {
			out[j] = fmt.Sprintf("%s:%s/%d", g.Body.State, g.Body.Reason, g.Body.Count)
		}
	}
	return out
}

// checkOnePerTransition asserts that every notification id is stored once
// and that every alarm of every device reads raised (or flapping), repeats
// counted 1, 2, 3... without gap or repeat, and at most one resolved.
// JetStream drops a re-publish with a known id, so the stream holds what
// the alarm promises downstream: one message per transition.
func (h *harness) checkOnePerTransition(ids []string) {
	h.t.Helper()
	for id, n := range testenv.StreamMsgIDs(h.t, h.nc, "SIGWATCH", "sigwatch.alarm.") {
		if n != 1 {
			h.t.Errorf("notification %s stored %d times, want once", id, n)
		}
	}
	for _, id := range ids {
		bySince := map[int64][]note{}
		for _, g := range h.notesOf(id) {
			bySince[g.Body.Since] = append(bySince[g.Body.Since], g)
		}
		for since, gs := range bySince {
			if err := checkSequence(gs); err != nil {
				h.t.Errorf("device %s, alarm since %d: %v: %v", id, since, err, states(gs))
			}
		}
	}
}

// checkSequence checks the notifications of one alarm, in stream order.
func checkSequence(gs []note) error {
	if len(gs) == 0 {
		return nil
	}
	if s := gs[0].Body.State; s != Raised && s != Flapping {
		return fmt.Errorf("starts with %s, want raised or flapping", s)
	}
	count := 0
	for j, g := range gs[1:] {
		switch g.Body.State {
		case Repeat:
			count++
			if g.Body.Count != count {
				return fmt.Errorf("repeat %d has count %d", count, g.Body.Count)
			}
		case Acked:
			if g.Body.Count != count {
				return fmt.Errorf("acked at count %d after repeat %d", g.Body.Count, count)
			}
		case Resolved:
			if j != len(gs)-2 {
				return fmt.Errorf("notifications after resolved")
			}
		case Raised:
			if gs[0].Body.State != Flapping || g.Body.Reason != ReasonStable {
				return fmt.Errorf("raised twice")
			}
		default:
			return fmt.Errorf("unexpected %s", g.Body.State)
		}
	}
	return nil
}

// gaps returns the times between consecutive notifications.
func gaps(gs []note) []time.Duration {
	var out []time.Duration
	for j := 1; j < len(gs); j++ {
		out = append(out, time.UnixMilli(gs[j].Body.At).Sub(time.UnixMilli(gs[j-1].Body.At)))
	}
	return out
}

func policy() Policy {
	return Policy{Interval: interval, Backoff: 1, MaxInterval: time.Hour, FlapCount: 0}
}

// TestRaisedRepeatsThenRecovered proves the lifecycle of a lost device: it
// is raised, repeated at the interval (growing by the backoff up to its
// cap), and resolved/recovered within a second of its first new signal,
// beside ingest's sigwatch.recovered. The alarms' clock is stepped to each
// repeat.
func TestRaisedRepeatsThenRecovered(t *testing.T) {
	h := newSteppedHarness(t)
	p := policy()
	a, _ := h.alarms("a", p)

	sent := h.signal("dev-1", "meter")
	raised := h.wait("dev-1", Raised, "", 5*time.Second)
	// The alarm says when the device was last heard of: its lost event's
	// last_seen, the time of its signal.
	if d := raised.Body.LastSeen - sent.UnixMilli(); d < -1000 || d > 1000 {
		t.Errorf("raised last_seen %d, want the signal's time %d", raised.Body.LastSeen, sent.UnixMilli())
	}
	testenv.WaitFor(t, 2*time.Second, "active{raised} 1", func() bool {
		return testutil.ToFloat64(a.m.active.WithLabelValues(Raised)) == 1
	})
	if raised.Body.Type != "meter" || raised.Subject != "sigwatch.alarm.meter" || raised.MsgID != raised.Body.ID {
		t.Errorf("raised = %+v on %s with id %s, want type meter on sigwatch.alarm.meter, Nats-Msg-Id = id", raised.Body, raised.Subject, raised.MsgID)
	}
	for range 3 {
		if r := h.stepToRepeat(a, "dev-1"); r.Body.LastSeen != raised.Body.LastSeen {
			t.Errorf("repeat last_seen %d, want the raise's %d", r.Body.LastSeen, raised.Body.LastSeen)
		}
	}
	for j, g := range gaps(h.notesOf("dev-1")[:4]) {
		if g < interval-20*time.Millisecond || g > interval+250*time.Millisecond {
			t.Errorf("gap %d between notifications = %v, want the interval %v", j, g, interval)
		}
	}
	back := h.signal("dev-1", "meter")
	res := h.wait("dev-1", Resolved, ReasonRecovered, 3*time.Second)
	if lag := res.At.Sub(back); lag > time.Second {
		t.Errorf("resolved/recovered %v after the first new signal, want within 1s", lag)
	}
	if rec := h.recovered.Bodies(func(r dispatch.Recovered) bool { return r.Device == "dev-1" }); len(rec) != 1 || rec[0].LostAt != raised.Body.Since {
		t.Errorf("sigwatch.recovered events = %+v, want one for the loss at %d", rec, raised.Body.Since)
	}
	if n, r := testutil.ToFloat64(a.m.notifications.WithLabelValues(Repeat)), testenv.Observations(t, a.m.repeatLag); n < 3 || float64(r) < n {
		t.Errorf("metrics: %v repeats notified, %v repeat lags observed; want at least 3, and a lag for each", n, r)
	}
	testenv.WaitFor(t, 2*time.Second, "active{raised} 0", func() bool {
		return testutil.ToFloat64(a.m.active.WithLabelValues(Raised)) == 0 &&
			testutil.ToFloat64(a.m.notifications.WithLabelValues(Resolved)) == 1
	})
	h.checkOnePerTransition([]string{"dev-1"})
}

// TestRepeatBackoff proves that repeats back off by the factor up to the
// cap. The alarms' clock is stepped to each repeat.
func TestRepeatBackoff(t *testing.T) {
	h := newSteppedHarness(t)
	p := policy()
	p.Backoff, p.MaxInterval = 2, 4*interval
	a, _ := h.alarms("a", p)
	h.signal("dev-b", "")
	h.wait("dev-b", Raised, "", 5*time.Second)
	for range 5 {
		h.stepToRepeat(a, "dev-b")
	}
	want := []time.Duration{interval, 2 * interval, 4 * interval, 4 * interval, 4 * interval}
	for j, g := range gaps(h.notesOf("dev-b")[:6]) {
		if g < want[j]-20*time.Millisecond || g > want[j]+250*time.Millisecond {
			t.Errorf("gap %d = %v, want %v", j, g, want[j])
		}
	}
	h.checkOnePerTransition([]string{"dev-b"})
}

// TestLostAfterComebackRaisesNothing proves that a lost event for a device
// that has signalled since its deadline raises nothing.
func TestLostAfterComebackRaisesNothing(t *testing.T) {
	h := newHarness(t)
	a, _ := h.alarms("a", policy())
	h.signal("dev-c", "")
	stop := h.keepAlive("", "dev-c")
	defer stop()
	old := time.Now().Add(-time.Second).UnixMilli()
	ev := dispatch.Lost{ID: dispatch.LostID("dev-c", old), Device: "dev-c", Deadline: old, FiredAt: old}
	msg, _ := dispatch.Encode(dispatch.Subjects{}, ev)
	if err := h.pub.Publish(h.ctx, []dispatch.Message{msg})[0]; err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the late lost event handled", func() bool {
		_, ok, err := a.Get(h.ctx, "dev-c")
		return err == nil && ok
	})
	testenv.Never(t, 2*interval, "the alarm of a device that came back not idle, or notified", func() bool {
		v, _, _ := a.Get(h.ctx, "dev-c")
		return v.State != "idle" || len(h.notesOf("dev-c")) != 0
	})
	if v, _, _ := a.Get(h.ctx, "dev-c"); v.State != "idle" {
		t.Errorf("alarm of a device that came back = %+v, want idle", v)
	}
}

// TestAck proves that an ack without an end resolves the alarm and stops
// its repeats (resolved/acked, nothing else), and that an ack with an end
// says acked once, pauses them and resumes them after it while the device
// is still silent; a second ack at the same count moves the end and is
// stored once, the same notification.
func TestAck(t *testing.T) {
	h := newHarness(t)
	a, _ := h.alarms("a", policy())
	h.signal("dev-ack", "")
	h.signal("dev-snooze", "")
	h.wait("dev-ack", Repeat, "", 5*time.Second)
	h.wait("dev-snooze", Repeat, "", 5*time.Second)

	if _, err := a.Ack(h.ctx, "dev-ack", time.Time{}, ""); err != nil {
		t.Fatal(err)
	}
	h.wait("dev-ack", Resolved, ReasonAcked, 2*time.Second)
	acked := len(h.notesOf("dev-ack"))
	afterResolved := func() bool { return len(h.notesOf("dev-ack")) > acked }
	if gs := h.notes.Where(func(n dispatch.Alarm) bool { return n.Device == "dev-ack" && n.State == Acked }); len(gs) != 0 {
		t.Errorf("an ack without an end sent %v, want resolved/acked only", states(gs))
	}
	first, err := a.Ack(h.ctx, "dev-snooze", time.Now().Add(time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(1500 * time.Millisecond)
	v, err := a.Ack(h.ctx, "dev-snooze", until, "ops")
	if err != nil || v.State != Acked || v.AckedUntil != until.UnixMilli() || v.Count != first.Count || v.AckedBy != "ops" {
		t.Fatalf("ack until: got %+v, %v; want acked until %d at count %d by ops", v, err, until.UnixMilli(), first.Count)
	}
	ack := h.wait("dev-snooze", Acked, "", 2*time.Second)
	if want := NoteID("dev-snooze", v.Since, Acked, v.Count); ack.MsgID != want || ack.Body.ID != want ||
		ack.Body.Count != v.Count || ack.Body.Since != v.Since || ack.Body.Type != h.notesOf("dev-snooze")[0].Body.Type {
		t.Errorf("acked = %+v (msg id %q), want id %s, count %d, since %d, the raise's type", ack.Body, ack.MsgID, want, v.Count, v.Since)
	}
	// v.Count repeats were sent when the ack landed; the next waits for its end.
	testenv.Never(t, time.Until(until)-100*time.Millisecond, "a notification while acked, or after resolved", func() bool {
		return afterResolved() || len(h.notes.Where(func(n dispatch.Alarm) bool { return n.Device == "dev-snooze" && n.Count > v.Count })) > 0
	})
	testenv.WaitFor(t, 3*time.Second, "repeats resumed", func() bool {
		gs := h.notesOf("dev-snooze")
		return gs[len(gs)-1].Body.Count > v.Count
	})
	for _, g := range h.notesOf("dev-snooze") {
		if g.Body.Count == v.Count+1 && (g.Body.State != Repeat || g.Body.At < until.UnixMilli() || g.At.After(until.Add(500*time.Millisecond))) {
			t.Errorf("after the ack: %s at %v, want a repeat just after %v", states([]note{g}), g.At, until)
		}
	}
	testenv.Never(t, 2*interval, "the acked alarm going on after resolved", afterResolved)
	if gs := h.notes.Where(func(n dispatch.Alarm) bool { return n.Device == "dev-snooze" && n.State == Acked }); len(gs) != 1 {
		t.Errorf("two acks at one count stored %v, want one acked", states(gs))
	}
	if _, err := a.Ack(h.ctx, "nobody", time.Time{}, ""); err != ErrNoAlarm {
		t.Errorf("ack of a device without alarm: %v, want ErrNoAlarm", err)
	}
	h.signal("dev-snooze", "")
	h.wait("dev-snooze", Resolved, ReasonRecovered, 2*time.Second)
	h.checkOnePerTransition([]string{"dev-ack", "dev-snooze"})
}

// TestMuteByType proves that a mute by type suppresses the notifications
// of that type only while the alarms underneath go on, and that it ends on
// its own.
func TestMuteByType(t *testing.T) {
	h := newHarness(t)
	a, _ := h.alarms("a", policy())
	m, err := a.AddMute(h.ctx, Mute{Type: "meter", Until: time.Now().Add(2 * time.Second).UnixMilli(), Comment: "maintenance"})
	if err != nil {
		t.Fatal(err)
	}
	if ms, err := a.Mutes(h.ctx); err != nil || len(ms) != 1 || ms[0].ID != m.ID {
		t.Fatalf("mutes = %+v, %v; want [%s]", ms, err, m.ID)
	}
	h.signal("dev-meter", "meter")
	h.signal("dev-tracker", "tracker")
	h.wait("dev-tracker", Repeat, "", 5*time.Second)
	testenv.Never(t, time.Until(time.UnixMilli(m.Until))-200*time.Millisecond, "a notification of the muted type", func() bool {
		return len(h.notesOf("dev-meter")) != 0
	})
	if gs := h.notesOf("dev-tracker"); len(gs) < 3 {
		t.Errorf("type not muted got %v, want raised and repeats", states(gs))
	}
	first := h.wait("dev-meter", Repeat, "", 3*time.Second)
	if first.Body.Count < 2 || first.Body.At < m.Until {
		t.Errorf("first meter notification after the mute = %+v, want a repeat after %d with the count gone on underneath", first.Body, m.Until)
	}
	if ms, err := a.Mutes(h.ctx); err != nil || len(ms) != 0 {
		t.Errorf("mutes after the end = %+v, %v; want none", ms, err)
	}
	// A mute removed early stops suppressing at once.
	m2, err := a.AddMute(h.ctx, Mute{Device: "dev-tracker", Until: time.Now().Add(time.Hour).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	// A repeat decided after the mute was stored is muted, and the
	// notifications decided before it are out by then.
	v, _, err := a.Get(h.ctx, "dev-tracker")
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Second, "a repeat of dev-tracker decided under the mute", func() bool {
		w, _, err := a.Get(h.ctx, "dev-tracker")
		return err == nil && w.Count > v.Count
	})
	n := len(h.notesOf("dev-tracker"))
	testenv.Never(t, 2*interval, "a notification of the muted device", func() bool { return len(h.notesOf("dev-tracker")) != n })
	if ok, err := a.RemoveMute(h.ctx, m2.ID); !ok || err != nil {
		t.Fatalf("remove mute: %v %v", ok, err)
	}
	testenv.WaitFor(t, 2*time.Second, "notifications after unmute", func() bool { return len(h.notesOf("dev-tracker")) > n })
}

// TestRemoveResolves proves that removing a device resolves its alarm with
// reason removed and that its old lost events raise nothing after.
func TestRemoveResolves(t *testing.T) {
	h := newHarness(t)
	a, _ := h.alarms("a", policy())
	h.signal("dev-rm", "")
	raised := h.wait("dev-rm", Raised, "", 5*time.Second)
	if open, err := a.Remove(h.ctx, "dev-rm"); !open || err != nil {
		t.Fatalf("remove: got %v, %v; want an open alarm resolved", open, err)
	}
	h.wait("dev-rm", Resolved, ReasonRemoved, 2*time.Second)
	// The lost event delivered again raises nothing.
	ev := dispatch.Lost{ID: dispatch.LostID("dev-rm", raised.Body.Since) + "-again", Device: "dev-rm", Deadline: raised.Body.Since}
	msg, _ := dispatch.Encode(dispatch.Subjects{}, ev)
	if err := h.pub.Publish(h.ctx, []dispatch.Message{msg})[0]; err != nil {
		t.Fatal(err)
	}
	testenv.Never(t, 3*interval, "a notification of a removed device after raised, resolved:removed", func() bool {
		return len(h.notesOf("dev-rm")) != 2
	})
}

// TestReplicasOneNotificationPerTransition proves that two and three alarm
// replicas on the same devices publish exactly one notification per
// transition: every id once in the stream, repeats counted without gap or
// duplicate, one resolved per alarm. The alarms' clock is stepped through
// four repeats of every alarm.
func TestReplicasOneNotificationPerTransition(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			h := newSteppedHarness(t)
			for r := range n {
				h.alarms(fmt.Sprintf("r%d", r), policy())
			}
			ids := h.raiseAll("dev", 40)
			h.waitAll(ids, Raised, "", 10*time.Second)
			for k := 1; k <= 4; k++ {
				h.stepAll(ids, k)
			}
			h.recoverAll(ids)
			// Nothing more of the resolved alarms, however far the clock
			// moves. (Silent again, each device is lost anew a threshold
			// after its signal: a new alarm.)
			resolved := map[string]int64{}
			for _, n := range h.notes.Bodies(func(n dispatch.Alarm) bool { return n.State == Resolved }) {
				resolved[n.Device] = n.Since
			}
			done := h.notes.Len()
			h.clock.Advance(2 * interval)
			testenv.Never(t, 200*time.Millisecond, "a notification of an alarm after its resolved", func() bool {
				for _, e := range h.notes.Events()[done:] {
					if since, ok := resolved[e.Body.Device]; ok && e.Body.Since == since {
						return true
					}
				}
				return false
			})
			h.checkOnePerTransition(ids)
		})
	}
}

// TestFlappingNotifiesOnce proves that a device that keeps going lost and
// coming back produces one flapping notification, not one per flap, and
// that it ends with resolved/stable once the device is stable.
func TestFlappingNotifiesOnce(t *testing.T) {
	h := newHarness(t)
	p := policy()
	p.FlapCount, p.FlapWindow, p.FlapStable = 2, time.Minute, 1500*time.Millisecond
	h.alarms("a", p)
	for cycle := range 7 {
		h.signal("dev-flap", "")
		// Lost once the threshold passes, then back.
		testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("loss %d", cycle+1), func() bool {
			v, err := h.store.Devices(h.ctx, []string{"dev-flap"})
			return err == nil && v[0].LostDeadline != 0
		})
		time.Sleep(100 * time.Millisecond)
	}
	stop := h.keepAlive("", "dev-flap")
	defer stop()
	h.wait("dev-flap", Resolved, ReasonStable, 5*time.Second)
	var flapping, raised int
	for _, g := range h.notesOf("dev-flap") {
		switch g.Body.State {
		case Flapping:
			flapping++
		case Raised:
			raised++
		}
	}
	if flapping != 1 || raised != 2 {
		t.Errorf("notifications over 7 flaps: %v; want 2 raised (and resolved), then one flapping, then resolved/stable",
			states(h.notesOf("dev-flap")))
	}
	h.checkOnePerTransition([]string{"dev-flap"})
}

// TestRepeatsAcrossDoubling proves that repeat timers survive a doubling of
// the deadline shards and of the repeat timer shards: every alarm goes on
// repeating without a skipped or doubled repeat, and the doubling of the
// timers drains and finishes. The alarms' clock is stepped through the
// repeats, and stands still while the doubling drains.
func TestRepeatsAcrossDoubling(t *testing.T) {
	h := newSteppedHarness(t)
	h.alarms("a", policy())
	h.alarms("b", policy())
	ids := h.raiseAll("dbl", 30)
	h.waitAll(ids, Raised, "", 10*time.Second)
	h.stepAll(ids, 1)
	if _, err := h.store.Double(h.ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.timers.Double(h.ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	doubled := time.Now()
	// A timer leaves its old shard when it fires: step through repeats
	// until the doubling has drained, then three more.
	k := 1
	testenv.WaitFor(t, 15*time.Second, "the doubling of the repeat timers drained", func() bool {
		if tp, err := h.timers.Topology(h.ctx); err == nil && tp.Shards == 8 && tp.Prev == 0 {
			return true
		}
		k++
		h.stepAll(ids, k)
		return false
	})
	for range 3 {
		k++
		h.stepAll(ids, k)
	}
	for _, id := range ids {
		gs := h.notesOf(id)
		var after int
		for j, g := range gaps(gs) {
			if gs[j+1].At.After(doubled) {
				after++
			}
			if g > 2*interval+300*time.Millisecond {
				t.Errorf("device %s: %v between notifications %d and %d, want about %v", id, g, j, j+1, interval)
			}
		}
		if after < 3 {
			t.Errorf("device %s: %d repeats after the doubling, want it to go on repeating", id, after)
		}
	}
	h.recoverAll(ids)
	h.checkOnePerTransition(ids)
}

// TestRacingHandlersOneTransition proves the compare-and-set: the same lost
// event handled at the same moment by three replicas (as after a
// redelivery), and a repeat due on all of them at once, make one
// transition and one notification each.
func TestRacingHandlersOneTransition(t *testing.T) {
	h := newHarness(t)
	var reps []*Alarms
	for r := range 3 {
		a, _ := h.alarms(fmt.Sprintf("r%d", r), policy())
		reps = append(reps, a)
	}
	var ids []string
	for k := range 30 {
		ids = append(ids, fmt.Sprintf("race-%02d", k))
	}
	deadline := time.Now().Add(-time.Second).UnixMilli()
	var wg sync.WaitGroup
	for _, id := range ids {
		ev := dispatch.Lost{ID: dispatch.LostID(id, deadline), Device: id, Deadline: deadline}
		for _, a := range reps {
			wg.Go(func() {
				if err := (events{a}).Lost(h.ctx, ev); err != nil {
					t.Errorf("Lost: %v", err)
				}
			})
		}
	}
	wg.Wait()
	later := time.Now().Add(interval)
	for _, id := range ids {
		for _, a := range reps {
			wg.Go(func() {
				if _, _, err := a.wake(h.ctx, shard.Of(id, 4), shard.Entry{ID: id, Deadline: 1}, later, dispatch.Fence{}); err != nil {
					t.Errorf("wake: %v", err)
				}
			})
		}
	}
	wg.Wait()
	// Every transition was published before its handler returned: wait for
	// the recorder to have read what the stream holds.
	testenv.WaitFor(t, 5*time.Second, "every stored notification read", func() bool {
		return h.notes.Len() >= len(testenv.StreamMsgIDs(t, h.nc, "SIGWATCH", "sigwatch.alarm."))
	})
	for _, id := range ids {
		gs := h.notesOf(id)
		if len(gs) < 2 || gs[0].Body.State != Raised || gs[1].Body.State != Repeat || gs[1].Body.Count != 1 {
			t.Errorf("device %s: %v, want raised/0, repeat/1 ...", id, states(gs))
		}
	}
	h.checkOnePerTransition(ids)
}
