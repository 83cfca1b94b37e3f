package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

const testShards = 4

// protocolEnv names the MQTT version the tests' ingest subscribes with
// unless a test chooses (make test runs the broker tests on both).
const protocolEnv = "SIGWATCH_TEST_MQTT_PROTOCOL"

// rig is one test's servers and the building blocks ingest is made of.
type rig struct {
	env   *testenv.Env
	store *shard.Store
	topo  *shard.Watcher
	thr   *shard.Thresholds
	nc    *nats.Conn
	pub   *dispatch.Bus
	log   *slog.Logger // for start; nil: testLog(t)
	// drain is how long a stopping Run waits for work in flight; zero:
	// 500ms.
	drain time.Duration
}

// testLog is the log of ingest under test: on stderr with -v, else kept
// and printed only if the test fails.
func testLog(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	buf := &testenv.LogBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ingest log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, nil))
}

func newRig(t *testing.T, opts testenv.Options) *rig {
	t.Helper()
	opts.NATS = true
	env := testenv.New(t, opts)
	r := &rig{env: env, store: env.Store(t, ""), nc: env.Conn(t)}
	ctx := context.Background()
	var err error
	if r.topo, err = shard.NewWatcher(ctx, r.store, testShards, time.Second, nil); err != nil {
		t.Fatalf("topology: %v", err)
	}
	r.thr = shard.NewThresholds(r.store, 30*time.Second, map[string]time.Duration{"pump": 90 * time.Second})
	if r.pub, err = dispatch.New(ctx, r.nc, dispatch.Options{Storage: "memory"}); err != nil {
		t.Fatalf("dispatch: %v", err)
	}
	return r
}

// running is one Run of ingest in the background.
type running struct {
	*Ingest
	reg     *prometheus.Registry
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// start builds ingest with opts against r's servers and runs it until the
// test ends (or stop is called).
func (r *rig) start(t *testing.T, opts Options) *running {
	t.Helper()
	if r.env.Mosquitto != nil && opts.Brokers == nil {
		opts.Brokers = []string{r.env.Mosquitto.URL}
	}
	if opts.ClientID == "" {
		opts.ClientID = "ingest-" + t.Name()
	}
	opts.Protocol = cmp.Or(opts.Protocol, os.Getenv(protocolEnv))
	opts.Thresholds = r.thr
	reg := prometheus.NewRegistry()
	log := r.log
	if log == nil {
		log = testLog(t)
	}
	in, err := New(opts, r.store, r.topo, r.pub, reg, log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	in.drain = cmp.Or(r.drain, 500*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{Ingest: in, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { run.done <- in.Run(ctx) }()
	t.Cleanup(func() { run.stop(t) })
	if len(opts.Brokers) > 0 {
		testenv.WaitFor(t, 10*time.Second, "ingest to subscribe", func() bool { return in.src.connectedAt.Load() != 0 })
	}
	return run
}

// stop ends Run and checks that it returns cleanly. It may be called again.
func (run *running) stop(t *testing.T) {
	t.Helper()
	run.cancel()
	if run.stopped {
		return
	}
	run.stopped = true
	select {
	case err := <-run.done:
		if err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Run did not return within 10s of its context ending")
	}
}

// stored waits until signals_total reaches n.
func (run *running) stored(t *testing.T, n int) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%d signals stored", n), func() bool {
		return testutil.ToFloat64(run.m.signals) >= float64(n)
	})
}

// device is an MQTT client as a device is: one session, which never
// reconnects behind the test's back.
func device(t *testing.T, url string) mqtt.Client {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("dev-%d", time.Now().UnixNano()))
	return testenv.MQTT(t, o.SetAutoReconnect(false).SetConnectRetry(false))
}

// publish sends as devices do: QoS 1, waiting for the broker's PUBACK.
func publish(t *testing.T, c mqtt.Client, topic string, payload any) {
	t.Helper()
	tok := c.Publish(topic, 1, false, payload)
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish %q: %v", topic, tok.Error())
	}
}

// every runs f every d, on a goroutine of wg, until stop is closed.
func every(wg *sync.WaitGroup, stop <-chan struct{}, d time.Duration, f func()) {
	wg.Go(func() {
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				f()
			}
		}
	})
}

func (r *rig) deadline(t *testing.T, id string) (int64, bool) {
	t.Helper()
	ms, ok, err := r.store.Score(context.Background(), shard.Deadlines, shard.Of(id, testShards), id)
	if err != nil {
		t.Fatalf("score of %q: %v", id, err)
	}
	return ms, ok
}

// within checks that a deadline is threshold after a time between from and to.
func within(t *testing.T, id string, got int64, from, to time.Time, threshold time.Duration) {
	t.Helper()
	lo, hi := from.Add(threshold).UnixMilli(), to.Add(threshold).UnixMilli()
	if got < lo || got > hi {
		t.Errorf("deadline of %q = %d, want within [%d, %d] (signal time + %v)", id, got, lo, hi, threshold)
	}
}

// Deadlines of signals over MQTT land in their device's shard, at receive
// time + threshold, and a first-seen device is recorded in the registry.
func TestSignalsLandInTheirShard(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	dev := device(t, r.env.Mosquitto.URL)
	// A retained message is replayed on every subscription: not a signal.
	if tok := dev.Publish("devices/retained/signal", 1, true, "last will"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish retained: %v", tok.Error())
	}
	run := r.start(t, Options{})

	ids := []string{"d1", "d2", "sensor-17", "a.b*c> d", "ünï"}
	before := time.Now()
	for _, id := range ids {
		publish(t, dev, "devices/"+id+"/signal", "")
	}
	run.stored(t, len(ids))
	after := time.Now()
	for _, id := range ids {
		got, ok := r.deadline(t, id)
		if !ok {
			t.Fatalf("%q is not in its shard %d", id, shard.Of(id, testShards))
		}
		within(t, id, got, before, after, 30*time.Second)
	}
	if _, ok := r.deadline(t, "retained"); ok {
		t.Errorf("a replayed retained message was stored as a signal")
	}
	devs, err := r.store.Devices(context.Background(), ids)
	if err != nil {
		t.Fatal(err)
	}
	for j, d := range devs {
		// Untyped devices cost no registry entry: the deadline is all.
		if d != (shard.Device{}) {
			t.Errorf("registry entry of untyped %q = %+v, want none", ids[j], d)
		}
	}
	if got := testutil.ToFloat64(run.m.newDevices); got != float64(len(ids)) {
		t.Errorf("new_devices_total = %v, want %d", got, len(ids))
	}
	// Signals again: no device is new any more, deadlines move forward.
	for _, id := range ids {
		publish(t, dev, "devices/"+id+"/signal", "")
	}
	run.stored(t, 2*len(ids))
	if got := testutil.ToFloat64(run.m.newDevices); got != float64(len(ids)) {
		t.Errorf("after second signals: new_devices_total = %v, want %d", got, len(ids))
	}
}

// A type level selects the per-type threshold, and a per-device override
// wins over both.
func TestTypeLevelAndThresholds(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	run := r.start(t, Options{Topics: []string{"devices/+/+/signal"}, IDLevel: 2, TypeLevel: 1})
	dev := device(t, r.env.Mosquitto.URL)
	ctx := context.Background()

	before := time.Now()
	publish(t, dev, "devices/pump/p1/signal", "")
	publish(t, dev, "devices/meter/m1/signal", "")
	run.stored(t, 2)
	after := time.Now()
	p1, _ := r.deadline(t, "p1")
	within(t, "p1", p1, before, after, 90*time.Second)
	m1, _ := r.deadline(t, "m1")
	within(t, "m1", m1, before, after, 30*time.Second)
	devs, _ := r.store.Devices(ctx, []string{"p1"})
	if devs[0].Type != "pump" {
		t.Errorf("registry type of p1 = %q, want pump", devs[0].Type)
	}

	if err := r.store.SetOverride(ctx, "m1", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := r.thr.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	before = time.Now()
	publish(t, dev, "devices/meter/m1/signal", "")
	run.stored(t, 3)
	after = time.Now()
	m1, _ = r.deadline(t, "m1")
	within(t, "m1 (override)", m1, before, after, 10*time.Minute)
}

// In payload mode the signal time comes from "ts"; an older ts never pulls
// a deadline back, and a ts in the future or too far past is clamped.
func TestPayloadTimestamps(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	run := r.start(t, Options{TimestampMode: TimestampPayload, MaxSkew: time.Minute})
	dev := device(t, r.env.Mosquitto.URL)
	thr := 30 * time.Second
	ts := func(at time.Time) string { return fmt.Sprintf(`{"ts":%d}`, at.UnixMilli()) }

	t0 := time.Now().Add(-10 * time.Second)
	publish(t, dev, "devices/p/signal", ts(t0))
	run.stored(t, 1)
	want := t0.Add(thr).UnixMilli()
	if got, _ := r.deadline(t, "p"); got != want {
		t.Fatalf("deadline from ts = %d, want %d", got, want)
	}

	// Out of order: an older ts, as a number and as RFC 3339.
	publish(t, dev, "devices/p/signal", ts(t0.Add(-20*time.Second)))
	publish(t, dev, "devices/p/signal", fmt.Sprintf(`{"ts":%q}`, t0.Add(-5*time.Second).UTC().Format(time.RFC3339Nano)))
	run.stored(t, 3)
	if got, _ := r.deadline(t, "p"); got != want {
		t.Errorf("after older ts values: deadline = %d, want %d (never backwards)", got, want)
	}

	// Newer, as RFC 3339: moves forward.
	t1 := time.Now().Add(-2 * time.Second).Truncate(time.Millisecond)
	publish(t, dev, "devices/p/signal", fmt.Sprintf(`{"ts":%q}`, t1.Format(time.RFC3339Nano)))
	run.stored(t, 4)
	if got, want := mustDeadline(t, r, "p"), t1.Add(thr).UnixMilli(); got != want {
		t.Errorf("after newer ts: deadline = %d, want %d", got, want)
	}

	// Future and far past ts values are clamped into [now-1m, now].
	before := time.Now()
	publish(t, dev, "devices/future/signal", ts(time.Now().Add(time.Hour)))
	publish(t, dev, "devices/past/signal", ts(time.Now().Add(-time.Hour)))
	run.stored(t, 6)
	after := time.Now()
	within(t, "future", mustDeadline(t, r, "future"), before, after, thr)
	within(t, "past", mustDeadline(t, r, "past"), before.Add(-time.Minute), after.Add(-time.Minute), thr)
}

func mustDeadline(t *testing.T, r *rig, id string) int64 {
	t.Helper()
	ms, ok := r.deadline(t, id)
	if !ok {
		t.Fatalf("%q has no deadline", id)
	}
	return ms
}

// Invariant 7: bad input of every kind is refused loudly — counted and
// forwarded to sigwatch.invalid — and good devices in the same stream of
// messages are stored.
func TestInvalidInputIsRefusedAndLosesNothingElse(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	invalid := testenv.Record[dispatch.Invalid](t, r.nc, r.pub.Subjects().Invalid())
	run := r.start(t, Options{
		Topics:        []string{"devices/+/signal", "short"},
		TimestampMode: TimestampPayload,
		Config:        Config{MaxIDLen: 16},
	})
	dev := device(t, r.env.Mosquitto.URL)
	good := fmt.Sprintf(`{"ts":%d}`, time.Now().UnixMilli())

	bad := []struct{ topic, payload, reason string }{
		{"devices//signal", good, "empty_id"},
		{"devices/" + strings.Repeat("x", 17) + "/signal", good, "id_too_long"},
		{"short", good, "no_id_level"},
		{"devices/b1/signal", "not json \xff", "bad_payload"},
		{"devices/b2/signal", `{"v":1}`, "missing_timestamp"},
		{"devices/b3/signal", `{"ts":"yesterday"}`, "bad_timestamp"},
		{"devices/b4/signal", `{"ts":true}`, "bad_timestamp"},
	}
	var goodIDs []string
	for j, b := range bad {
		id := fmt.Sprintf("g%d", j)
		goodIDs = append(goodIDs, id)
		publish(t, dev, "devices/"+id+"/signal", good)
		publish(t, dev, b.topic, b.payload)
	}
	publish(t, dev, "devices/last.one*>/signal", good) // NATS wildcards: valid
	goodIDs = append(goodIDs, "last.one*>")
	run.stored(t, len(goodIDs))
	for _, id := range goodIDs {
		mustDeadline(t, r, id)
	}

	var got, want []string
	for _, b := range bad {
		want = append(want, b.reason+" "+b.topic)
	}
	invalid.WaitN(t, 10*time.Second, len(bad), fmt.Sprintf("%d invalid events", len(bad)), nil)
	for _, e := range invalid.Events() {
		ev := e.Body
		if ev.ID == "" || ev.At == 0 || e.MsgID != ev.ID {
			t.Errorf("invalid event %+v: want an id (= Nats-Msg-Id %q) and a time", ev, e.MsgID)
		}
		if ev.Reason == "bad_payload" && ev.PayloadEncoding != "base64" {
			t.Errorf("non-UTF-8 payload forwarded with encoding %q, want base64", ev.PayloadEncoding)
		}
		got = append(got, ev.Reason+" "+ev.Topic)
	}
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("invalid events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, b := range bad {
		if b.reason == "bad_timestamp" {
			continue
		}
		if n := testutil.ToFloat64(run.m.invalid[b.reason]); n != 1 {
			t.Errorf("invalid_total{reason=%q} = %v, want 1", b.reason, n)
		}
	}
	if n := testutil.ToFloat64(run.m.invalid["bad_timestamp"]); n != 2 {
		t.Errorf("invalid_total{reason=bad_timestamp} = %v, want 2", n)
	}
	// Refused messages are acked: nothing is left in flight.
	testenv.WaitFor(t, 5*time.Second, "nothing in flight", func() bool { return len(run.pipe.slots) == 0 })
}

// Topics with control characters or invalid UTF-8 never get past the
// broker, so the handler is driven directly for them.
type fakeMessage struct {
	mqtt.Message
	topic   string
	payload []byte
	acked   chan struct{}
}

func (m *fakeMessage) Topic() string   { return m.topic }
func (m *fakeMessage) Payload() []byte { return m.payload }
func (m *fakeMessage) Ack()            { close(m.acked) }
func (m *fakeMessage) Retained() bool  { return false }
func (m *fakeMessage) Duplicate() bool { return false }

func TestControlCharactersAreRefused(t *testing.T) {
	r := newRig(t, testenv.Options{})
	invalid := testenv.Record[dispatch.Invalid](t, r.nc, r.pub.Subjects().Invalid())
	run := r.start(t, Options{})
	for j, topic := range []string{"devices/a\x01b/signal", "devices/a\xffb/signal", "devices/a\u009bb/signal"} {
		m := &fakeMessage{topic: topic, payload: []byte("\x00\x01"), acked: make(chan struct{})}
		run.src.onMessage(nil, m)
		select {
		case <-m.acked:
		case <-time.After(5 * time.Second):
			t.Fatalf("%q was not acked", topic)
		}
		ev := invalid.WaitN(t, 5*time.Second, j+1, fmt.Sprintf("an invalid event for %q", topic), nil)[j].Body
		if ev.Reason != "bad_id" {
			t.Errorf("reason for %q = %q, want bad_id", topic, ev.Reason)
		}
	}
	ok := &fakeMessage{topic: "devices/ok/signal", acked: make(chan struct{})}
	run.src.onMessage(nil, ok)
	select {
	case <-ok.acked:
	case <-time.After(5 * time.Second):
		t.Fatal("good message was not acked")
	}
	mustDeadline(t, r, "ok")
}

// A message is acked to the broker only after its deadline is stored: while
// Redis is down nothing is dropped (the in-flight bound holds the rest at the
// broker), and even an ingest stopped meanwhile loses nothing — the broker
// delivers the unacked messages to the next session.
func TestAckAfterStore(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true, RedisPersist: true})
	opts := Options{ClientID: "ingest-ack", Config: Config{MaxInFlight: 8}}
	run := r.start(t, opts)
	dev := device(t, r.env.Mosquitto.URL)
	publish(t, dev, "devices/warm/signal", "")
	run.stored(t, 1)

	// Redis down while ingest runs: messages wait, then are all stored.
	if err := r.env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	for j := range 20 {
		publish(t, dev, fmt.Sprintf("devices/a%d/signal", j), "")
	}
	testenv.WaitFor(t, 10*time.Second, "the in-flight bound to fill", func() bool { return len(run.pipe.slots) == 8 })
	// A handler that ignored the bound would show now.
	testenv.Never(t, 100*time.Millisecond, "in flight other than the bound 8", func() bool { return len(run.pipe.slots) != 8 })
	testenv.WaitFor(t, 10*time.Second, "a store error to be counted", func() bool { return testutil.ToFloat64(run.m.storeErrors) > 0 })
	if err := r.env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	run.stored(t, 21)
	for j := range 20 {
		mustDeadline(t, r, fmt.Sprintf("a%d", j))
	}

	// Redis down and ingest stopped before it could store anything.
	if err := r.env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	for j := range 20 {
		publish(t, dev, fmt.Sprintf("devices/b%d/signal", j), "")
	}
	testenv.WaitFor(t, 10*time.Second, "the in-flight bound to fill", func() bool { return len(run.pipe.slots) == 8 })
	run.stop(t)
	if err := r.env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	for j := range 20 {
		if _, ok := r.deadline(t, fmt.Sprintf("b%d", j)); ok {
			t.Fatalf("b%d stored by an ingest that had no Redis", j)
		}
	}
	next := r.start(t, opts)
	next.stored(t, 20)
	for j := range 20 {
		mustDeadline(t, r, fmt.Sprintf("b%d", j))
	}
}

// A device that was lost and is absent from its shard produces a recovered
// event on its next signal, with the de-duplication id of that loss.
func TestRecovery(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	recovered := testenv.Record[dispatch.Recovered](t, r.nc, r.pub.Subjects().Prefix+".recovered.>")
	ctx := context.Background()
	lostDeadline := time.Now().Add(-time.Minute).UnixMilli()
	if err := r.store.LostMarks().Mark(ctx, "v1", lostDeadline, lostDeadline+5); err != nil {
		t.Fatal(err)
	}
	run := r.start(t, Options{Topics: []string{"devices/+/+/signal"}, IDLevel: 2, TypeLevel: 1})
	dev := device(t, r.env.Mosquitto.URL)

	before := time.Now()
	publish(t, dev, "devices/new/n1/signal", "") // first seen: no recovery
	publish(t, dev, "devices/valve/v1/signal", "")
	run.stored(t, 2)
	after := time.Now()
	m := recovered.Wait(t, 5*time.Second, "a recovered event", nil)
	if m.Subject != "sigwatch.recovered.valve" {
		t.Errorf("subject = %q, want sigwatch.recovered.valve", m.Subject)
	}
	ev := m.Body
	if ev.ID != dispatch.RecoveredID("v1", lostDeadline) || ev.Device != "v1" || ev.Type != "valve" || ev.LostAt != lostDeadline {
		t.Errorf("recovered event = %+v, want id %q, device v1, type valve, lost_at %d", ev, dispatch.RecoveredID("v1", lostDeadline), lostDeadline)
	}
	if ev.RecoveredAt < before.UnixMilli() || ev.RecoveredAt > after.UnixMilli() {
		t.Errorf("recovered_at = %d, want within [%d, %d]", ev.RecoveredAt, before.UnixMilli(), after.UnixMilli())
	}
	testenv.Never(t, 200*time.Millisecond, "a second recovered event", func() bool { return recovered.Len() > 1 })
	devs, _ := r.store.Devices(ctx, []string{"v1"})
	if devs[0].LostDeadline != 0 {
		t.Errorf("lost mark still set after recovery: %+v", devs[0])
	}
	if got := testutil.ToFloat64(run.m.recovered); got != 1 {
		t.Errorf("recovered_total = %v, want 1", got)
	}
}

// Invariant 6: the watermark advances while ingest consumes, stands still
// while the broker is down, and resumes after it with the gap recorded as
// an outage.
func TestWatermark(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	ctx := context.Background()
	run := r.start(t, Options{Config: Config{ProbeInterval: 10 * time.Millisecond, OutageAfter: 500 * time.Millisecond}})
	watermark := func() (int64, []shard.Outage) {
		wm, outs, err := r.store.Watermarks().Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return wm, outs
	}
	start := time.Now().UnixMilli()
	testenv.WaitFor(t, 5*time.Second, "the watermark to pass the start", func() bool { wm, _ := watermark(); return wm > start })
	if g := testenv.Gathered(t, run.reg, "sigwatch_ingest_connected"); g != 1 {
		t.Errorf("connected = %v while connected, want 1", g)
	}

	if err := r.env.Mosquitto.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now().UnixMilli()
	testenv.WaitFor(t, 5*time.Second, "ingest to notice the broker is gone", func() bool {
		c := run.src.client.Load()
		return !(*c).IsConnectionOpen()
	})
	// Barriers in flight settle, never past the moment the broker died.
	testenv.Never(t, 100*time.Millisecond, fmt.Sprintf("the watermark past the moment the broker died (%d)", killed), func() bool {
		wm, _ := watermark()
		return wm > killed
	})
	held, _ := watermark()
	if held > killed {
		t.Errorf("watermark %d is past the moment the broker died (%d)", held, killed)
	}
	testenv.Never(t, time.Second, fmt.Sprintf("the watermark moved from %d while the broker was down", held), func() bool {
		wm, _ := watermark()
		return wm != held
	})
	if g := testenv.Gathered(t, run.reg, "sigwatch_ingest_connected"); g != 0 {
		t.Errorf("connected = %v while the broker is down, want 0", g)
	}
	if age := testenv.Gathered(t, run.reg, "sigwatch_ingest_watermark_age_seconds"); age < 1 {
		t.Errorf("watermark age = %vs after 1s without a broker, want >= 1", age)
	}

	if err := r.env.Mosquitto.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now().UnixMilli()
	testenv.WaitFor(t, 10*time.Second, "the watermark to resume", func() bool { wm, _ := watermark(); return wm > restarted })
	_, outs := watermark()
	found := false
	for _, o := range outs {
		// It starts at the last report before the loss: held, or a barrier
		// cut before the broker died that settled after held was read.
		if o.Start >= held && o.Start <= killed && o.End > restarted {
			found = true
		}
	}
	if !found {
		t.Errorf("outages %+v, want one from %d (or a barrier before the kill at %d) to after %d", outs, held, killed, restarted)
	}
}

// Signal stores a deadline synchronously without MQTT, refuses bad ids,
// never advances the watermark, and fails once ingest has stopped.
func TestSignalAPI(t *testing.T) {
	r := newRig(t, testenv.Options{})
	run := r.start(t, Options{})
	ctx := context.Background()
	if !run.Connected() {
		t.Errorf("Connected() = false without brokers, want true (nothing to connect to)")
	}

	at := time.Now().Add(-5 * time.Second)
	if err := run.Signal(ctx, "api-1", "pump", at); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if got, want := mustDeadline(t, r, "api-1"), at.Add(90*time.Second).UnixMilli(); got != want {
		t.Errorf("deadline = %d, want %d (at + pump threshold)", got, want)
	}
	for _, bad := range []string{"", "a\x00b", strings.Repeat("x", 300)} {
		if err := run.Signal(ctx, bad, "", time.Time{}); !errors.As(err, new(*InvalidError)) {
			t.Errorf("Signal(%q) = %v, want an InvalidError", bad, err)
		}
	}
	// Without a broker, Signal is the only way in and it is synchronous:
	// the watermark follows the clock, so HTTP-only fleets are watched too.
	called := time.Now().UnixMilli()
	testenv.WaitFor(t, 5*time.Second, "the watermark to pass the Signal calls", func() bool {
		wm, _, _ := r.store.Watermarks().Read(ctx)
		return wm >= called
	})
	run.stop(t)
	if err := run.Signal(ctx, "api-2", "", time.Time{}); !errors.Is(err, ErrStopped) {
		t.Errorf("Signal after stop = %v, want ErrStopped", err)
	}
}

// Every goroutine Run starts (and the MQTT client's) is gone once it returns.
// The servers' and the shared clients' goroutines are the kit's background;
// paho's are not, so they count.
func TestRunLeavesNoGoroutines(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	dev := device(t, r.env.Mosquitto.URL)
	before := testenv.IgnoreCurrent()
	run := r.start(t, Options{})
	for j := range 50 {
		publish(t, dev, fmt.Sprintf("devices/l%d/signal", j), "")
	}
	if err := run.Signal(context.Background(), "api", "", time.Time{}); err != nil {
		t.Fatal(err)
	}
	run.stored(t, 51)
	if testenv.Leaks(before) == nil {
		t.Fatal("no goroutines but those from before Run while it runs: the check sees nothing of Run")
	}
	run.stop(t)
	testenv.VerifyNone(t, before)
}

// Run stops promptly, leaving nothing behind, while it cannot reach the
// broker, and the watermark never moves meanwhile.
func TestRunStopsWhileBrokerUnreachable(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	url := r.env.Mosquitto.URL
	if err := r.env.Mosquitto.Kill(); err != nil {
		t.Fatal(err)
	}
	before := testenv.IgnoreCurrent()
	in, err := New(Options{Brokers: []string{url}, ClientID: "unreachable", Thresholds: r.thr}, r.store, r.topo, r.pub, nil, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	// Signal works without the broker.
	if err := in.Signal(context.Background(), "api", "", time.Time{}); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	testenv.Never(t, 300*time.Millisecond, "the watermark moved without a broker", func() bool {
		wm, _, _ := r.store.Watermarks().Read(context.Background())
		return wm != 0
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s")
	}
	if wm, _, _ := r.store.Watermarks().Read(context.Background()); wm != 0 {
		t.Errorf("watermark = %d without a broker, want 0", wm)
	}
	testenv.VerifyNone(t, before)
}

// Members of a shared group split the stream; the watermark is that of the
// group's slowest member, and a member that stops on purpose leaves so the
// group no longer waits for it.
func TestSharedGroup(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	r.drain = drainTimeout // b must hand over, however loaded the machine
	ctx := context.Background()
	a := r.start(t, Options{ClientID: "member-a", SharedGroup: "g"})
	b := r.start(t, Options{ClientID: "member-b", SharedGroup: "g"})
	dev := device(t, r.env.Mosquitto.URL)
	for j := range 100 {
		publish(t, dev, fmt.Sprintf("devices/s%d/signal", j), "")
	}
	testenv.WaitFor(t, 10*time.Second, "100 signals stored by the group", func() bool {
		return testutil.ToFloat64(a.m.signals)+testutil.ToFloat64(b.m.signals) >= 100
	})
	if na, nb := testutil.ToFloat64(a.m.signals), testutil.ToFloat64(b.m.signals); na == 0 || nb == 0 || na+nb != 100 {
		t.Errorf("members stored %v and %v signals, want a split of 100", na, nb)
	}
	for j := range 100 {
		mustDeadline(t, r, fmt.Sprintf("s%d", j))
	}
	testenv.WaitFor(t, 5*time.Second, "both members in the watermark", func() bool {
		ms, err := r.store.Watermarks().Members(ctx)
		return err == nil && ms["g|member-a"] > 0 && ms["g|member-b"] > 0
	})

	b.stop(t)
	ms, err := r.store.Watermarks().Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ms["g|member-b"]; ok {
		t.Errorf("members after b stopped = %v, want b gone", ms)
	}
	now := time.Now().UnixMilli()
	testenv.WaitFor(t, 5*time.Second, "the watermark to move on with a alone", func() bool {
		wm, _, err := r.store.Watermarks().Read(ctx)
		return err == nil && wm > now
	})
}

// Ingest writes through a shard.Writer: it reports the topology epoch it
// writes with, and when it lags behind a doubling whose old shards refuse
// old placements, its signals are placed again under the new topology
// instead of being lost or landing in an old shard.
func TestWritesFollowADoubling(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	ctx := context.Background()
	run := r.start(t, Options{ClientID: "writer"})
	dev := device(t, r.env.Mosquitto.URL)
	epoch := r.topo.Current().Epoch
	testenv.WaitFor(t, 5*time.Second, "ingest to report its writer epoch", func() bool {
		ws, err := r.store.Writers(ctx)
		return err == nil && ws["writer"].Epoch == epoch
	})

	// The topology doubles; ingest's watcher is not running, so ingest
	// still places by the old one until a shard refuses it.
	doubled, err := r.store.Double(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for i := range testShards {
		if err := r.store.RaiseFloor(ctx, i, doubled.Epoch); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for j := range 40 {
		id := fmt.Sprintf("m%d", j)
		ids = append(ids, id)
		publish(t, dev, "devices/"+id+"/signal", "")
	}
	run.stored(t, len(ids))
	moved := 0
	for _, id := range ids {
		now, old := shard.Of(id, doubled.Shards), shard.Of(id, testShards)
		if _, ok, err := r.store.Score(ctx, shard.Deadlines, now, id); err != nil || !ok {
			t.Errorf("%q not in its shard %d under %d shards (err %v)", id, now, doubled.Shards, err)
		}
		if now != old {
			moved++
			if _, ok, _ := r.store.Score(ctx, shard.Deadlines, old, id); ok {
				t.Errorf("%q written to its old shard %d after the floor was raised", id, old)
			}
		}
	}
	if moved == 0 {
		t.Fatalf("no device moved shard in the doubling; pick other ids")
	}
	testenv.WaitFor(t, 5*time.Second, "ingest to report the new epoch", func() bool {
		ws, err := r.store.Writers(ctx)
		return err == nil && ws["writer"].Epoch == doubled.Epoch
	})
	run.stop(t)
	if ws, _ := r.store.Writers(ctx); len(ws) != 0 {
		t.Errorf("writers after stop = %v, want none", ws)
	}
}

// TestBrokerDropsAreSurfaced checks that the broker's own count of dropped
// messages reaches the metrics, since Mosquitto says so nowhere else.
func TestBrokerDropsAreSurfaced(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true, NATS: true})
	run := r.start(t, Options{})
	defer run.stop(t)
	testenv.WaitFor(t, 10*time.Second, "the broker's dropped count", func() bool {
		return gatheredOr(t, run.reg, "sigwatch_ingest_broker_dropped_messages", -1) >= 0
	})
}
