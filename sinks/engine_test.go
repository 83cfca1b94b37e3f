package sinks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/internal/webhooks"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/sinks"
)

// rig is a stream, a Redis and the sinks under test, whose log goes to
// log.
type rig struct {
	env   *testenv.Env
	store *shard.Store
	pub   *dispatch.Bus
	log   testenv.LogBuffer
}

func newRig(t *testing.T) *rig {
	env := testenv.New(t, testenv.Options{NATS: true})
	pub, err := dispatch.New(t.Context(), env.Conn(t), dispatch.Options{Storage: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	return &rig{env: env, store: env.Store(t, "sw"), pub: pub}
}

// start builds and runs the sinks cs until the test ends.
func (r *rig) start(t *testing.T, cs []sinks.Config, env map[string]string) *sinks.Sinks {
	t.Helper()
	ss, err := sinks.New(t.Context(), sinks.Options{Sinks: cs, Store: r.store, Pub: r.pub, Getenv: func(k string) string { return env[k] },
		Log: slog.New(slog.NewTextHandler(&r.log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = ss.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ss
}

// publish puts alarm notifications of device dev on the stream: raised,
// then repeats 1..n-1.
func (r *rig) publish(t *testing.T, evs ...dispatch.Event) {
	t.Helper()
	var msgs []dispatch.Message
	for _, ev := range evs {
		m, err := dispatch.Encode(r.pub.Subjects(), ev)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	for _, err := range r.pub.Publish(t.Context(), msgs) {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func note(dev, state string, since int64, count int) dispatch.Alarm {
	return dispatch.Alarm{ID: fmt.Sprintf("%s@%d/%s/%d", dev, since, state, count), Device: dev, Type: "meter",
		State: state, Count: count, Since: since, At: time.Now().UnixMilli()}
}

func webhookSink(t *testing.T, name string, rate float64) (sinks.Config, map[string]string, *testenv.WebhookReceiver) {
	sec := webhooks.NewSecret()
	rc := testenv.NewWebhookReceiver(t, sec)
	env := map[string]string{"HOOK_URL": rc.URL() + "/hook", "HOOK_SECRET": sec.Reveal()}
	return sinks.Config{Name: name, Type: sinks.TypeWebhook, URLEnv: "HOOK_URL", SecretsEnv: []string{"HOOK_SECRET"}, Rate: rate,
		RetryFor: time.Minute}, env, rc
}

// TestWebhookSinkDeliversInOrderOnce: every alarm notification and storm
// event reaches a webhook once, in the order published, signed.
func TestWebhookSinkDeliversInOrderOnce(t *testing.T) {
	r := newRig(t)
	cfg, env, rc := webhookSink(t, "hook", 0)
	r.start(t, []sinks.Config{cfg}, env)
	since := time.Now().UnixMilli()
	evs := []dispatch.Event{note("d1", "raised", since, 0), note("d1", "repeat", since, 1), note("d1", sinks.Acked, since, 1),
		dispatch.Storm{ID: "storm/group:g@1/started", Scope: "group", Group: "g", State: "started", Devices: 3, Watched: 4, Since: since, At: since},
		note("d1", "resolved", since, 1)}
	r.publish(t, evs...)
	testenv.WaitFor(t, 10*time.Second, "5 deliveries", func() bool { return len(rc.Deliveries()) >= 5 })
	time.Sleep(300 * time.Millisecond)
	got := rc.Deliveries()
	if len(got) != 5 || len(rc.Duplicates()) > 0 {
		t.Fatalf("deliveries %d, duplicates %v; want 5, none", len(got), rc.Duplicates())
	}
	for j, d := range got {
		var body struct{ ID string }
		_ = json.Unmarshal(d.Body, &body)
		want := ""
		switch ev := evs[j].(type) {
		case dispatch.Alarm:
			want = ev.ID
		case dispatch.Storm:
			want = ev.ID
		}
		if d.ID != want || body.ID != want {
			t.Errorf("delivery %d: webhook-id %q body id %q, want %q", j, d.ID, body.ID, want)
		}
	}
}

// TestSinkBudgetHoldsAcrossABacklog: a queue of alarms goes out within the
// sink's budget in every sliding second, each once.
func TestSinkBudgetHoldsAcrossABacklog(t *testing.T) {
	r := newRig(t)
	cfg, env, rc := webhookSink(t, "paced", 10)
	const n = 40
	since := time.Now().UnixMilli()
	var evs []dispatch.Event
	for i := range n {
		evs = append(evs, note(fmt.Sprintf("dev-%d", i), "raised", since, 0))
	}
	r.start(t, []sinks.Config{cfg}, env)
	r.publish(t, evs...)
	testenv.WaitFor(t, 30*time.Second, "every alarm delivered", func() bool { return len(rc.Deliveries()) >= n })
	if err := testenv.OverBudget(rc.Times(http.StatusNoContent), 10, time.Second); err != nil {
		t.Error(err)
	}
	if d := rc.Duplicates(); len(d) > 0 {
		t.Errorf("delivered twice: %v", d)
	}
}

// TestSinkWaitsOutADownReceiver: notifications published while the
// receiver is down are delivered once it is back, once each, in order.
func TestSinkWaitsOutADownReceiver(t *testing.T) {
	r := newRig(t)
	cfg, env, rc := webhookSink(t, "down", 0)
	r.start(t, []sinks.Config{cfg}, env)
	rc.Down()
	since := time.Now().UnixMilli()
	var ids []string
	for i := range 20 {
		a := note("d-down", "repeat", since, i)
		ids = append(ids, a.ID)
		r.publish(t, a)
	}
	time.Sleep(3 * time.Second)
	rc.Up()
	testenv.WaitFor(t, 30*time.Second, "every notification after the receiver is back", func() bool { return len(rc.Deliveries()) >= 20 })
	for j, d := range rc.Deliveries() {
		if d.ID != ids[j] {
			t.Fatalf("delivery %d is %s, want %s: out of order", j, d.ID, ids[j])
		}
	}
}

// TestGoneDisablesOnlyThatSink: a sink answering 410 is disabled and says
// so on sigwatch.system; another sink goes on.
func TestGoneDisablesOnlyThatSink(t *testing.T) {
	r := newRig(t)
	gone, genv, grc := webhookSink(t, "gone", 0)
	ok, oenv, orc := webhookSink(t, "fine", 0)
	for k, v := range oenv {
		genv["OK_"+k] = v
	}
	ok.URLEnv, ok.SecretsEnv = "OK_HOOK_URL", []string{"OK_HOOK_SECRET"}
	system := testenv.RecordStream[dispatch.System](t, r.env.Conn(t), "SIGWATCH", "sigwatch.system")
	grc.Answer(http.StatusGone, 0)
	ss := r.start(t, []sinks.Config{gone, ok}, genv)
	since := time.Now().UnixMilli()
	r.publish(t, note("d1", "raised", since, 0), note("d2", "raised", since, 0))
	testenv.WaitFor(t, 10*time.Second, "the other sink's deliveries", func() bool { return len(orc.Deliveries()) >= 2 })
	system.Wait(t, 10*time.Second, "sink_disabled", func(s dispatch.System) bool { return s.Kind == "sink_disabled" })
	views, err := ss.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if views[0].State != sinks.StateDisabled || !strings.Contains(views[0].LastError, "410") || views[1].State != sinks.StateOK {
		t.Errorf("views %+v; want gone disabled (410), fine ok", views)
	}
	if log := r.log.String(); !strings.Contains(log, "sink disabled") || !strings.Contains(log, "sink=gone") {
		t.Errorf("no log line says the sink gone is disabled:\n%s", log)
	}
}

// TestRefusedGoesToTheDeadLetters: a notification the sink refuses as
// such lands on sigwatch.sink.failed.<sink> and the next one goes on.
func TestRefusedGoesToTheDeadLetters(t *testing.T) {
	r := newRig(t)
	cfg, env, rc := webhookSink(t, "picky", 0)
	failed := testenv.RecordStream[dispatch.SinkFailure](t, r.env.Conn(t), "SIGWATCH", "sigwatch.sink.failed.picky")
	rc.Answer(http.StatusBadRequest, 0)
	r.start(t, []sinks.Config{cfg}, env)
	since := time.Now().UnixMilli()
	a := note("d1", "raised", since, 0)
	r.publish(t, a)
	f := failed.Wait(t, 10*time.Second, "the dead letter", func(f dispatch.SinkFailure) bool { return f.EventID == a.ID })
	if !strings.Contains(f.Body.Error, "400") {
		t.Errorf("dead letter error %q, want the 400", f.Body.Error)
	}
	rc.Answer(0, 0)
	b := note("d2", "raised", since, 0)
	r.publish(t, b)
	testenv.WaitFor(t, 10*time.Second, "the next notification", func() bool { return rc.Count(b.ID) == 1 })
}
