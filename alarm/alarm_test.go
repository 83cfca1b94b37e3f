package alarm

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/scanner"
	"github.com/sigwatch/sigwatch/shard"
)

const (
	threshold = 500 * time.Millisecond
	interval  = 300 * time.Millisecond
)

// harness is one test's pipeline on real Redis and NATS: ingest (signals
// through Signal, the watermark moved by the harness), a deadline scanner
// publishing lost events, and any number of alarm replicas.
type harness struct {
	t      *testing.T
	ctx    context.Context
	store  *shard.Store
	topo   *shard.Watcher
	timers *shard.Store
	rtopo  *shard.Watcher
	pub    *dispatch.Publisher
	js     jetstream.JetStream
	in     *ingest.Ingest
	log    *slog.Logger
	notes  *noteLog
	stops  []func()
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	env := testenv.New(t, testenv.Options{NATS: true})
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{env.Redis.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	keys := shard.NewKeys("sw")
	h := &harness{t: t, ctx: ctx, store: shard.NewStore(c, keys), timers: shard.NewStore(c, keys.Alarm())}
	h.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if h.topo, err = shard.NewWatcher(ctx, h.store, 4, 100*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	if h.rtopo, err = shard.NewWatcher(ctx, h.timers, 4, 100*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(env.NATS.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if h.pub, err = dispatch.New(ctx, nc, dispatch.Options{AckWait: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if h.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	thr := shard.NewThresholds(h.store, threshold, nil)
	if h.in, err = ingest.New(ingest.Options{ClientID: "alarm-test", Thresholds: thr}, h.store, h.topo, h.pub, nil, nil); err != nil {
		t.Fatal(err)
	}
	h.notes = watchNotes(t, h.js)

	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { h.topo.Run(runCtx) })
	wg.Go(func() { h.rtopo.Run(runCtx) })
	wg.Go(func() { _ = h.in.Run(runCtx) })
	wg.Go(func() { // plays ingest's watermark
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			_, _ = h.store.AdvanceWatermark(runCtx, time.Now().UnixMilli(), time.Hour)
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
		}
	})
	sc, err := scanner.New(scanner.Options{Replica: "deadlines", Thresholds: thr, LeaseTTL: time.Second,
		Rebalance: 100 * time.Millisecond, Poll: 10 * time.Millisecond}, h.store, h.topo, h.pub, nil, h.log)
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
		checkNoLeak(t)
	})
	return h
}

// alarms starts an alarm replica with policy p and returns the function
// that stops it (the test's cleanup stops it too).
func (h *harness) alarms(replica string, p Policy) (*Alarms, func()) {
	h.t.Helper()
	a, err := New(Options{Policy: p, Replica: replica, AckWait: 2 * time.Second, LeaseTTL: time.Second,
		Rebalance: 100 * time.Millisecond, Poll: 10 * time.Millisecond, DrainCheck: 200 * time.Millisecond,
		CountEvery: 100 * time.Millisecond},
		h.store, h.topo, h.timers, h.rtopo, h.pub, nil, h.log.With("replica", replica))
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
func (h *harness) keepAlive(typ string, ids ...string) (stop func()) {
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, id := range ids {
				_ = h.in.Signal(ctx, id, typ, time.Time{})
			}
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

// got is one notification or recovered event read from the stream.
type got struct {
	subject string
	msgID   string
	alarm   dispatch.Alarm
	rec     dispatch.Recovered
	at      time.Time
}

// noteLog reads sigwatch.alarm.> and sigwatch.recovered.> from the stream
// as they are stored.
type noteLog struct {
	mu  sync.Mutex
	all []got
}

func watchNotes(t *testing.T, js jetstream.JetStream) *noteLog {
	t.Helper()
	ctx := context.Background()
	cons, err := js.OrderedConsumer(ctx, "SIGWATCH", jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"sigwatch.alarm.>", "sigwatch.recovered.>"}})
	if err != nil {
		t.Fatal(err)
	}
	l := &noteLog{}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		g := got{subject: m.Subject(), msgID: m.Headers().Get(nats.MsgIdHdr), at: time.Now()}
		if strings.HasPrefix(g.subject, "sigwatch.alarm.") {
			_ = json.Unmarshal(m.Data(), &g.alarm)
		} else {
			_ = json.Unmarshal(m.Data(), &g.rec)
		}
		l.mu.Lock()
		l.all = append(l.all, g)
		l.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return l
}

// of returns the notifications about device id, in stream order.
func (l *noteLog) of(id string) []got {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []got
	for _, g := range l.all {
		if g.alarm.Device == id {
			out = append(out, g)
		}
	}
	return out
}

func (l *noteLog) recoveredOf(id string) []dispatch.Recovered {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []dispatch.Recovered
	for _, g := range l.all {
		if g.rec.Device == id {
			out = append(out, g.rec)
		}
	}
	return out
}

// wait polls until device id has a notification in state (and reason, if
// not empty), and returns it.
func (h *harness) wait(id, state, reason string, timeout time.Duration) got {
	h.t.Helper()
	var found got
	testenv.WaitFor(h.t, timeout, fmt.Sprintf("%s %s/%s", id, state, reason), func() bool {
		for _, g := range h.notes.of(id) {
			if g.alarm.State == state && (reason == "" || g.alarm.Reason == reason) {
				found = g
				return true
			}
		}
		return false
	})
	return found
}

// states returns the state/count sequence of id's notifications.
func states(gs []got) []string {
	out := make([]string, len(gs))
	for j, g := range gs {
		out[j] = fmt.Sprintf("%s/%d", g.alarm.State, g.alarm.Count)
		if g.alarm.Reason != "" {
			out[j] = fmt.Sprintf("%s:%s/%d", g.alarm.State, g.alarm.Reason, g.alarm.Count)
		}
	}
	return out
}

// streamIDs counts each Nats-Msg-Id stored in the stream under prefix.
// JetStream drops a re-publish with a known id, so this is what the alarm
// promises downstream: one message per transition.
func (h *harness) streamIDs(prefix string) map[string]int {
	h.t.Helper()
	st, err := h.js.Stream(h.ctx, "SIGWATCH")
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := st.Info(h.ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	ids := map[string]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(h.ctx, seq)
		if err != nil {
			h.t.Fatal(err)
		}
		if strings.HasPrefix(m.Subject, prefix) {
			ids[m.Header.Get(nats.MsgIdHdr)]++
		}
	}
	return ids
}

// checkOnePerTransition asserts that every notification id is stored once
// and that every alarm of every device reads raised (or flapping), repeats
// counted 1, 2, 3... without gap or repeat, and at most one resolved.
func (h *harness) checkOnePerTransition(ids []string) {
	h.t.Helper()
	for id, n := range h.streamIDs("sigwatch.alarm.") {
		if n != 1 {
			h.t.Errorf("notification %s stored %d times, want once", id, n)
		}
	}
	for _, id := range ids {
		bySince := map[int64][]got{}
		for _, g := range h.notes.of(id) {
			bySince[g.alarm.Since] = append(bySince[g.alarm.Since], g)
		}
		for since, gs := range bySince {
			if err := checkSequence(gs); err != nil {
				h.t.Errorf("device %s, alarm since %d: %v: %v", id, since, err, states(gs))
			}
		}
	}
}

// checkSequence checks the notifications of one alarm, in stream order.
func checkSequence(gs []got) error {
	if len(gs) == 0 {
		return nil
	}
	if s := gs[0].alarm.State; s != Raised && s != Flapping {
		return fmt.Errorf("starts with %s, want raised or flapping", s)
	}
	count := 0
	for j, g := range gs[1:] {
		switch g.alarm.State {
		case Repeat:
			count++
			if g.alarm.Count != count {
				return fmt.Errorf("repeat %d has count %d", count, g.alarm.Count)
			}
		case Resolved:
			if j != len(gs)-2 {
				return fmt.Errorf("notifications after resolved")
			}
		case Raised:
			if gs[0].alarm.State != Flapping || g.alarm.Reason != ReasonStable {
				return fmt.Errorf("raised twice")
			}
		default:
			return fmt.Errorf("unexpected %s", g.alarm.State)
		}
	}
	return nil
}

// gaps returns the times between consecutive notifications.
func gaps(gs []got) []time.Duration {
	var out []time.Duration
	for j := 1; j < len(gs); j++ {
		out = append(out, time.UnixMilli(gs[j].alarm.At).Sub(time.UnixMilli(gs[j-1].alarm.At)))
	}
	return out
}

// checkNoLeak fails if a goroutine of the alarm package is still running.
func checkNoLeak(t *testing.T) {
	t.Helper()
	testenv.CheckNoLeak(t, 3*time.Second, "sigwatch/alarm.(*Alarms)")
}

func policy() Policy {
	return Policy{Interval: interval, Backoff: 1, MaxInterval: time.Hour, FlapCount: 0}
}

// TestRaisedRepeatsThenRecovered proves the lifecycle of a lost device: it
// is raised, repeated at the interval (growing by the backoff up to its
// cap), and resolved/recovered within a second of its first new signal,
// beside ingest's sigwatch.recovered.
func TestRaisedRepeatsThenRecovered(t *testing.T) {
	h := newHarness(t)
	p := policy()
	a, _ := h.alarms("a", p)

	h.signal("dev-1", "meter")
	raised := h.wait("dev-1", Raised, "", 5*time.Second)
	testenv.WaitFor(t, 2*time.Second, "active{raised} 1", func() bool {
		return value(a.m.active.WithLabelValues(Raised)) == 1
	})
	if raised.alarm.Type != "meter" || raised.subject != "sigwatch.alarm.meter" || raised.msgID != raised.alarm.ID {
		t.Errorf("raised = %+v on %s with id %s, want type meter on sigwatch.alarm.meter, Nats-Msg-Id = id", raised.alarm, raised.subject, raised.msgID)
	}
	testenv.WaitFor(t, 5*time.Second, "three repeats", func() bool { return len(h.notes.of("dev-1")) >= 4 })
	for j, g := range gaps(h.notes.of("dev-1")[:4]) {
		if g < interval-20*time.Millisecond || g > interval+250*time.Millisecond {
			t.Errorf("gap %d between notifications = %v, want the interval %v", j, g, interval)
		}
	}
	back := h.signal("dev-1", "meter")
	res := h.wait("dev-1", Resolved, ReasonRecovered, 3*time.Second)
	if lag := res.at.Sub(back); lag > time.Second {
		t.Errorf("resolved/recovered %v after the first new signal, want within 1s", lag)
	}
	if rec := h.notes.recoveredOf("dev-1"); len(rec) != 1 || rec[0].LostAt != raised.alarm.Since {
		t.Errorf("sigwatch.recovered events = %+v, want one for the loss at %d", rec, raised.alarm.Since)
	}
	if n, r := value(a.m.notifications.WithLabelValues(Repeat)), value(a.m.repeatLag); n < 3 || r < n {
		t.Errorf("metrics: %v repeats notified, %v repeat lags observed; want at least 3, and a lag for each", n, r)
	}
	testenv.WaitFor(t, 2*time.Second, "active{raised} 0", func() bool {
		return value(a.m.active.WithLabelValues(Raised)) == 0 &&
			value(a.m.notifications.WithLabelValues(Resolved)) == 1
	})
	h.checkOnePerTransition([]string{"dev-1"})
}

// TestRepeatBackoff proves that repeats back off by the factor up to the
// cap.
func TestRepeatBackoff(t *testing.T) {
	h := newHarness(t)
	p := policy()
	p.Backoff, p.MaxInterval = 2, 4*interval
	h.alarms("a", p)
	h.signal("dev-b", "")
	h.wait("dev-b", Raised, "", 5*time.Second)
	testenv.WaitFor(t, 10*time.Second, "five repeats", func() bool { return len(h.notes.of("dev-b")) >= 6 })
	want := []time.Duration{interval, 2 * interval, 4 * interval, 4 * interval, 4 * interval}
	for j, g := range gaps(h.notes.of("dev-b")[:6]) {
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
	msg, _ := dispatch.Encode(h.pub.Subjects().Lost(""), ev.ID, ev)
	if err := h.pub.Publish(h.ctx, []dispatch.Message{msg})[0]; err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the late lost event handled", func() bool {
		_, ok, err := a.Get(h.ctx, "dev-c")
		return err == nil && ok
	})
	time.Sleep(2 * interval)
	if v, _, _ := a.Get(h.ctx, "dev-c"); v.State != "idle" {
		t.Errorf("alarm of a device that came back = %+v, want idle", v)
	}
	if gs := h.notes.of("dev-c"); len(gs) != 0 {
		t.Errorf("notifications for a device that came back: %v, want none", states(gs))
	}
}

// TestAck proves that an ack without an end resolves the alarm and stops
// its repeats, and that an ack with an end pauses them and resumes them
// after it while the device is still silent.
func TestAck(t *testing.T) {
	h := newHarness(t)
	a, _ := h.alarms("a", policy())
	h.signal("dev-ack", "")
	h.signal("dev-snooze", "")
	h.wait("dev-ack", Repeat, "", 5*time.Second)
	h.wait("dev-snooze", Repeat, "", 5*time.Second)

	if _, err := a.Ack(h.ctx, "dev-ack", time.Time{}); err != nil {
		t.Fatal(err)
	}
	h.wait("dev-ack", Resolved, ReasonAcked, 2*time.Second)
	until := time.Now().Add(1500 * time.Millisecond)
	v, err := a.Ack(h.ctx, "dev-snooze", until)
	if err != nil || v.State != "acked" || v.AckedUntil != until.UnixMilli() {
		t.Fatalf("ack until: got %+v, %v; want acked until %d", v, err, until.UnixMilli())
	}
	time.Sleep(time.Until(until) - 100*time.Millisecond)
	if gs := h.notes.of("dev-ack"); gs[len(gs)-1].alarm.State != Resolved {
		t.Errorf("acked alarm went on: %v", states(gs))
	}
	// v.Count repeats were sent when the ack landed; the next waits for its end.
	for _, g := range h.notes.of("dev-snooze") {
		if g.alarm.Count > v.Count {
			t.Errorf("notification while acked until %v: %v", until, states([]got{g}))
		}
	}
	testenv.WaitFor(t, 3*time.Second, "repeats resumed", func() bool {
		gs := h.notes.of("dev-snooze")
		return gs[len(gs)-1].alarm.Count > v.Count
	})
	for _, g := range h.notes.of("dev-snooze") {
		if g.alarm.Count == v.Count+1 && (g.alarm.State != Repeat || g.alarm.At < until.UnixMilli() || g.at.After(until.Add(500*time.Millisecond))) {
			t.Errorf("after the ack: %s at %v, want a repeat just after %v", states([]got{g}), g.at, until)
		}
	}
	time.Sleep(2 * interval)
	if gs := h.notes.of("dev-ack"); gs[len(gs)-1].alarm.State != Resolved {
		t.Errorf("acked alarm went on: %v", states(gs))
	}
	if _, err := a.Ack(h.ctx, "nobody", time.Time{}); err != ErrNoAlarm {
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
	time.Sleep(time.Until(time.UnixMilli(m.Until)) - 200*time.Millisecond)
	if gs := h.notes.of("dev-meter"); len(gs) != 0 {
		t.Errorf("muted type notified: %v", states(gs))
	}
	if gs := h.notes.of("dev-tracker"); len(gs) < 3 {
		t.Errorf("type not muted got %v, want raised and repeats", states(gs))
	}
	first := h.wait("dev-meter", Repeat, "", 3*time.Second)
	if first.alarm.Count < 2 || first.alarm.At < m.Until {
		t.Errorf("first meter notification after the mute = %+v, want a repeat after %d with the count gone on underneath", first.alarm, m.Until)
	}
	if ms, err := a.Mutes(h.ctx); err != nil || len(ms) != 0 {
		t.Errorf("mutes after the end = %+v, %v; want none", ms, err)
	}
	// A mute removed early stops suppressing at once.
	m2, err := a.AddMute(h.ctx, Mute{Device: "dev-tracker", Until: time.Now().Add(time.Hour).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * interval)
	n := len(h.notes.of("dev-tracker"))
	time.Sleep(2 * interval)
	if got := len(h.notes.of("dev-tracker")); got != n {
		t.Errorf("muted device notified: %d notifications, want %d", got, n)
	}
	if ok, err := a.RemoveMute(h.ctx, m2.ID); !ok || err != nil {
		t.Fatalf("remove mute: %v %v", ok, err)
	}
	testenv.WaitFor(t, 2*time.Second, "notifications after unmute", func() bool { return len(h.notes.of("dev-tracker")) > n })
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
	ev := dispatch.Lost{ID: dispatch.LostID("dev-rm", raised.alarm.Since) + "-again", Device: "dev-rm", Deadline: raised.alarm.Since}
	msg, _ := dispatch.Encode(h.pub.Subjects().Lost(""), ev.ID, ev)
	if err := h.pub.Publish(h.ctx, []dispatch.Message{msg})[0]; err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * interval)
	if gs := h.notes.of("dev-rm"); len(gs) != 2 {
		t.Errorf("notifications of a removed device: %v, want raised, resolved:removed", states(gs))
	}
}

// TestReplicasOneNotificationPerTransition proves that two and three alarm
// replicas on the same devices publish exactly one notification per
// transition: every id once in the stream, repeats counted without gap or
// duplicate, one resolved per alarm.
func TestReplicasOneNotificationPerTransition(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			h := newHarness(t)
			for r := range n {
				h.alarms(fmt.Sprintf("r%d", r), policy())
			}
			var ids []string
			for k := range 40 {
				ids = append(ids, fmt.Sprintf("dev-%02d", k))
				h.signal(ids[k], "")
			}
			for _, id := range ids {
				h.wait(id, Repeat, "", 10*time.Second)
			}
			time.Sleep(3 * interval)
			for _, id := range ids {
				h.signal(id, "")
			}
			for _, id := range ids {
				h.wait(id, Resolved, ReasonRecovered, 5*time.Second)
			}
			time.Sleep(2 * interval)
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
	for _, g := range h.notes.of("dev-flap") {
		switch g.alarm.State {
		case Flapping:
			flapping++
		case Raised:
			raised++
		}
	}
	if flapping != 1 || raised != 2 {
		t.Errorf("notifications over 7 flaps: %v; want 2 raised (and resolved), then one flapping, then resolved/stable",
			states(h.notes.of("dev-flap")))
	}
	h.checkOnePerTransition([]string{"dev-flap"})
}

// TestRepeatsAcrossDoubling proves that repeat timers survive a doubling of
// the deadline shards and of the repeat timer shards: every alarm goes on
// repeating without a skipped or doubled repeat, and the doubling of the
// timers drains and finishes.
func TestRepeatsAcrossDoubling(t *testing.T) {
	h := newHarness(t)
	h.alarms("a", policy())
	h.alarms("b", policy())
	var ids []string
	for k := range 30 {
		ids = append(ids, fmt.Sprintf("dbl-%02d", k))
		h.signal(ids[k], "")
	}
	for _, id := range ids {
		h.wait(id, Repeat, "", 10*time.Second)
	}
	if _, err := h.store.Double(h.ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.timers.Double(h.ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	doubled := time.Now()
	testenv.WaitFor(t, 15*time.Second, "the doubling of the repeat timers drained", func() bool {
		tp, err := h.timers.Topology(h.ctx)
		return err == nil && tp.Shards == 8 && tp.Prev == 0
	})
	time.Sleep(3 * interval)
	for _, id := range ids {
		gs := h.notes.of(id)
		var after int
		for j, g := range gaps(gs) {
			if gs[j+1].at.After(doubled) {
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
	for _, id := range ids {
		h.signal(id, "")
	}
	for _, id := range ids {
		h.wait(id, Resolved, ReasonRecovered, 5*time.Second)
	}
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
					t.Errorf("onLost: %v", err)
				}
			})
		}
	}
	wg.Wait()
	later := time.Now().Add(interval)
	for _, id := range ids {
		for _, a := range reps {
			wg.Go(func() {
				if _, _, err := a.wake(h.ctx, shard.Of(id, 4), shard.Entry{ID: id, Deadline: 1}, later); err != nil {
					t.Errorf("wake: %v", err)
				}
			})
		}
	}
	wg.Wait()
	time.Sleep(interval)
	for _, id := range ids {
		gs := h.notes.of(id)
		if len(gs) < 2 || gs[0].alarm.State != Raised || gs[1].alarm.State != Repeat || gs[1].alarm.Count != 1 {
			t.Errorf("device %s: %v, want raised/0, repeat/1 ...", id, states(gs))
		}
	}
	h.checkOnePerTransition(ids)
}

// value reads a counter or gauge, or a histogram's sample count.
func value(c prometheus.Metric) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}
