package timer

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
)

// harness is one test's Redis, NATS, store and timer service.
type harness struct {
	t     *testing.T
	env   *testenv.Env
	nc    *nats.Conn
	store *shard.Store
	topo  *shard.Watcher
	pub   *dispatch.Bus
	fired *testenv.Recorder[dispatch.Timer]
}

func newHarness(t *testing.T, shards int) *harness {
	t.Helper()
	env := testenv.New(t, testenv.Options{NATS: true})
	ctx := t.Context()
	store := env.Store(t, "sw")
	topo, err := shard.NewWatcher(ctx, store, shards, 100*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	nc := env.Conn(t, nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	pub, err := dispatch.New(ctx, nc, dispatch.Options{AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, env: env, nc: nc, store: store, topo: topo, pub: pub}
	h.fired = testenv.RecordStream[dispatch.Timer](t, nc, "SIGWATCH", "sigwatch.timer.>")
	wctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go topo.Run(wctx)
	return h
}

// service starts a timer service with test timings until the test ends.
func (h *harness) service(replica string, mod func(*Options)) *Service {
	h.t.Helper()
	opts := Options{Replica: replica, Fire: true, Config: Config{NATS: true}, Consume: true,
		Engine: queue.Config{LeaseTTL: time.Second, Poll: 10 * time.Millisecond, Batch: 256}}
	if mod != nil {
		mod(&opts)
	}
	s, err := New(opts, h.store, h.topo, h.pub, nil, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			h.t.Errorf("timer service %s: %v", replica, err)
		}
	})
	return s
}

// resetStream waits for the reset stream the service creates and returns
// a JetStream client to publish resets with.
func (h *harness) resetStream() jetstream.JetStream {
	h.t.Helper()
	js, err := jetstream.New(h.nc)
	if err != nil {
		h.t.Fatal(err)
	}
	testenv.WaitFor(h.t, 5*time.Second, "the reset stream", func() bool {
		_, err := js.Stream(h.t.Context(), "SIGWATCH_TIMERS")
		return err == nil
	})
	return js
}

func mustReset(t *testing.T, s *Service, queue, id string, r Request) shard.TimerReset {
	t.Helper()
	tr, err := s.Limits().Reset(queue, id, r, s.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(t.Context(), []shard.TimerReset{tr}); err != nil {
		t.Fatal(err)
	}
	return tr
}

func after(d time.Duration) json.RawMessage { return json.RawMessage(strconv.Quote(d.String())) }

func TestResetThousandTimesFiresOnceAtLastDeadline(t *testing.T) {
	h := newHarness(t, 4)
	s := h.service("a", nil)
	var last shard.TimerReset
	for j := range 1000 {
		last = mustReset(t, s, "orders", "o-1", Request{After: after(400 * time.Millisecond),
			Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, j))})
	}
	ev := h.fired.Wait(t, 5*time.Second, "the timer's event", func(dispatch.Timer) bool { return true })
	if ev.Body.Deadline != last.Deadline || string(ev.Body.Payload) != `{"n":999}` {
		t.Fatalf("fired at %d with %s, want the last deadline %d with {\"n\":999}", ev.Body.Deadline, ev.Body.Payload, last.Deadline)
	}
	if ev.At.UnixMilli() < last.Deadline || ev.Body.FiredAt < last.Deadline {
		t.Fatalf("fired early: received %d, fired_at %d, deadline %d", ev.At.UnixMilli(), ev.Body.FiredAt, last.Deadline)
	}
	if want := "orders/o-1@" + strconv.FormatInt(last.Deadline, 10); ev.Body.ID != want || ev.Header.Get("Nats-Msg-Id") != want ||
		ev.Body.Queue != "orders" || ev.Body.Timer != "o-1" || ev.Subject != "sigwatch.timer.orders" {
		t.Fatalf("event %+v on %s, msg id %q", ev.Body, ev.Subject, ev.Header.Get("Nats-Msg-Id"))
	}
	testenv.Never(t, time.Second, "a second event", func() bool { return h.fired.Len() > 1 })
	if _, ok, _ := s.Get(t.Context(), "orders", "o-1"); ok {
		t.Fatal("the fired timer is still stored")
	}
	if n, _ := h.store.Size(t.Context(), shard.Timers, shard.Of(last.Member, 4)); n != 0 {
		t.Fatalf("%d members left", n)
	}
}

func TestExtendNeverMovesEarlierSetDoes(t *testing.T) {
	h := newHarness(t, 2)
	s := h.service("a", nil)
	ctx := t.Context()
	late := mustReset(t, s, "q", "x", Request{After: after(3 * time.Second), Payload: json.RawMessage(`"p1"`)})
	mustReset(t, s, "q", "x", Request{After: after(300 * time.Millisecond)})
	got, ok, err := s.Get(ctx, "q", "x")
	if err != nil || !ok || got.Deadline != late.Deadline || string(got.Payload) != `"p1"` {
		t.Fatalf("after an earlier extend: %+v %v %v, want deadline %d with payload kept", got, ok, err, late.Deadline)
	}
	early := mustReset(t, s, "q", "x", Request{After: after(300 * time.Millisecond), Mode: "set"})
	got, _, _ = s.Get(ctx, "q", "x")
	if got.Deadline != early.Deadline {
		t.Fatalf("set: deadline %d, want %d", got.Deadline, early.Deadline)
	}
	ev := h.fired.Wait(t, 2*time.Second, "the timer set earlier", func(dispatch.Timer) bool { return true })
	if ev.Body.Deadline != early.Deadline || ev.At.UnixMilli() < early.Deadline || ev.At.UnixMilli() > late.Deadline {
		t.Fatalf("fired %+v at %d, want at its set deadline %d", ev.Body, ev.At.UnixMilli(), early.Deadline)
	}
	// A null payload removes it.
	mustReset(t, s, "q", "y", Request{After: after(time.Minute), Payload: json.RawMessage(`{"a":1}`)})
	mustReset(t, s, "q", "y", Request{After: after(time.Minute), Payload: json.RawMessage(`null`)})
	if got, _, _ := s.Get(ctx, "q", "y"); got.Payload != nil {
		t.Fatalf("payload %s after null", got.Payload)
	}
}

func TestCancelBeforeDeadlineFiresNothing(t *testing.T) {
	h := newHarness(t, 2)
	s := h.service("a", nil)
	tr := mustReset(t, s, "sessions", "s-9", Request{After: after(500 * time.Millisecond), Payload: json.RawMessage(`[1,2]`)})
	if ok, err := s.Cancel(t.Context(), "sessions", "s-9"); !ok || err != nil {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	if ok, _ := s.Cancel(t.Context(), "sessions", "s-9"); ok {
		t.Fatal("a second cancel found the timer")
	}
	testenv.Never(t, time.Until(time.UnixMilli(tr.Deadline))+time.Second, "an event of a cancelled timer", func() bool { return h.fired.Len() > 0 })
	if p, _ := h.store.Timers().Payloads(t.Context(), shard.Of(tr.Member, 2), []string{tr.Member}); p[0] != nil {
		t.Fatalf("payload %s left", p[0])
	}
}

func TestNATSResetsAckedOnceStored(t *testing.T) {
	h := newHarness(t, 4)
	s := h.service("a", nil)
	invalid := testenv.Record[dispatch.Invalid](t, h.nc, "sigwatch.invalid")
	js, ctx := h.resetStream(), t.Context()
	var batch []Request
	for j := range 100 {
		batch = append(batch, Request{ID: fmt.Sprint("t-", j), After: after(time.Minute), Payload: json.RawMessage(`{"j":` + strconv.Itoa(j) + `}`)})
	}
	batch = append(batch, Request{ID: "", After: after(time.Minute)})
	body, _ := json.Marshal(batch)
	if _, err := js.Publish(ctx, "sigwatch.timers.set.jobs", body); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "sigwatch.timers.set.jobs", []byte(`{"id":"single","after":1000}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "sigwatch.timers.set.jobs", []byte(`not json`)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the resets stored and acknowledged", func() bool {
		st, err := js.Stream(ctx, "SIGWATCH_TIMERS")
		return err == nil && st.CachedInfo().State.Msgs == 0
	})
	for j := range 100 {
		got, ok, err := s.Get(ctx, "jobs", fmt.Sprint("t-", j))
		if err != nil || !ok || string(got.Payload) != fmt.Sprintf(`{"j":%d}`, j) {
			t.Fatalf("t-%d: %+v %v %v", j, got, ok, err)
		}
	}
	invalid.WaitN(t, 5*time.Second, 2, "the empty id and the bad JSON dead-lettered", func(dispatch.Invalid) bool { return true })
	h.fired.Wait(t, 5*time.Second, "the single timer", func(e dispatch.Timer) bool { return e.Timer == "single" })
}

// TestNATSResetNotAckedUntilStored freezes Redis while resets arrive over
// NATS: they stay in the reset stream, unacknowledged, and the timers'
// watermark holds their deadlines back; once Redis answers again they are
// stored, acknowledged, and fire once, none before its deadline.
func TestNATSResetNotAckedUntilStored(t *testing.T) {
	h := newHarness(t, 2)
	s := h.service("a", func(o *Options) { o.AckWait = 2 * time.Second })
	js, ctx := h.resetStream(), t.Context()
	// An earlier deadline that the frozen reset extends: it must not fire
	// at it.
	first := mustReset(t, s, "jobs", "held", Request{After: after(time.Second)})
	if err := h.env.Redis.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = h.env.Redis.Resume()
		}
	}()
	if _, err := js.Publish(ctx, "sigwatch.timers.set.jobs", []byte(`[{"id":"held","after":"4s"},{"id":"new","after":"1s"}]`)); err != nil {
		t.Fatal(err)
	}
	published := time.Now()
	time.Sleep(2 * time.Second)
	st, err := js.Stream(ctx, "SIGWATCH_TIMERS")
	if err != nil || st.CachedInfo().State.Msgs != 1 {
		t.Fatalf("while Redis is frozen the reset stream holds %v messages (%v), want 1 unacknowledged", st.CachedInfo().State.Msgs, err)
	}
	if err := h.env.Redis.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	testenv.WaitFor(t, 10*time.Second, "the resets stored and acknowledged", func() bool {
		st, err := js.Stream(ctx, "SIGWATCH_TIMERS")
		return err == nil && st.CachedInfo().State.Msgs == 0
	})
	h.fired.WaitN(t, 10*time.Second, 2, "both timers fired", func(dispatch.Timer) bool { return true })
	testenv.Never(t, time.Second, "a third event", func() bool { return h.fired.Len() > 2 })
	for _, ev := range h.fired.Events() {
		if ev.Body.Timer == "held" && ev.Body.Deadline <= first.Deadline {
			t.Fatalf("the timer fired at its old deadline %d though a reset published before it waited in the stream", ev.Body.Deadline)
		}
		if ev.Body.Timer == "held" && ev.Body.Deadline < published.Add(4*time.Second).UnixMilli() {
			t.Fatalf("held fired at %d, before its reset's deadline", ev.Body.Deadline)
		}
	}
}
