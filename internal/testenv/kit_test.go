package testenv_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestNeverHoldsWhileFalse proves Never polls for its whole span and fails, naming what
// happened, as soon as the condition turns true.
func TestNeverHoldsWhileFalse(t *testing.T) {
	start := time.Now()
	calls := 0
	testenv.Never(t, 60*time.Millisecond, "never", func() bool { calls++; return false })
	if d := time.Since(start); d < 60*time.Millisecond || calls < 3 {
		t.Errorf("Never returned after %v and %d polls, want 60ms and several polls", d, calls)
	}

	r := &fakeT{TB: t}
	start = time.Now()
	testenv.Never(r, 10*time.Second, "the lights went out", func() bool { return time.Since(start) > 30*time.Millisecond })
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Never failed after %v, want as soon as the condition held", d)
	}
	if got := r.message(); !strings.HasPrefix(got, "the lights went out after ") || !strings.HasSuffix(got, " of 10s, want never") {
		t.Errorf("got %q, want %q", got, "the lights went out after ... of 10s, want never")
	}
}

// TestClockMovesOnlyWhenTold proves the manual clock reads what it was set to, across
// goroutines.
func TestClockMovesOnlyWhenTold(t *testing.T) {
	start := time.UnixMilli(1_700_000_000_000)
	c := testenv.NewClock(start)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(400*time.Millisecond); !got.Equal(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	c.Set(start)
	if got := c.Now(); !got.Equal(start) {
		t.Errorf("after Set: got %v, want %v", got, start)
	}
}

// TestStoreWritesUnderItsPrefix proves Env.Store gives a working store, and that two prefixes on
// one Redis do not see each other's timers.
func TestStoreWritesUnderItsPrefix(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	ctx := context.Background()
	a, b := env.Store(t, "a"), env.Store(t, "b")
	if _, err := a.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: {{ID: "d", Deadline: 42}}}); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := a.Score(ctx, shard.Deadlines, 0, "d"); err != nil || !ok || got != 42 {
		t.Errorf("score under a: got %d %v %v, want 42", got, ok, err)
	}
	if _, ok, err := b.Score(ctx, shard.Deadlines, 0, "d"); err != nil || ok {
		t.Errorf("score under b: got present %v, %v; want absent", ok, err)
	}
}

type note struct {
	ID     string `json:"id"`
	Device string `json:"device"`
}

// TestRecordersKeepWhatArrives proves both recorders decode bodies, keep subjects and
// Nats-Msg-Id, answer queries and waits, and that StreamMsgIDs counts what the stream stored.
func TestRecordersKeepWhatArrives(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	nc := env.Conn(t)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	core := testenv.Record[note](t, nc, "s.note.>")
	stream := testenv.RecordStream[note](t, nc, "S", "s.note.>")
	publish := func(subject, id, device string) {
		t.Helper()
		m := nats.NewMsg(subject)
		m.Header.Set(nats.MsgIdHdr, id)
		m.Data = []byte(`{"id":"` + id + `","device":"` + device + `"}`)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	publish("s.note.a", "1", "d1")
	publish("s.note.b", "2", "d2")
	publish("s.note.a", "1", "d1") // a duplicate: JetStream stores it once, core NATS delivers it
	publish("s.other", "3", "d1")

	for name, r := range map[string]*testenv.Recorder[note]{"core": core, "stream": stream} {
		r.Require(func(e testenv.Event[note]) error {
			if e.MsgID != e.Body.ID {
				return errors.New("Nats-Msg-Id is not the body's id")
			}
			return nil
		})
		e := r.Wait(t, 5*time.Second, name+" d2", func(n note) bool { return n.Device == "d2" })
		if e.Subject != "s.note.b" || e.MsgID != "2" || e.At.IsZero() {
			t.Errorf("%s: got %+v, want d2 on s.note.b with Nats-Msg-Id 2", name, e)
		}
		if got, ok := r.ByMsgID("1"); !ok || got.Body.Device != "d1" {
			t.Errorf("%s: ByMsgID(1) = %+v %v, want d1", name, got, ok)
		}
		if got := r.Bodies(func(n note) bool { return n.Device == "d1" }); len(got) == 0 || got[0].ID != "1" {
			t.Errorf("%s: bodies of d1 = %+v, want note 1 first", name, got)
		}
	}
	core.WaitN(t, 5*time.Second, 3, "three notes on core NATS", nil)
	if got := core.MsgIDs(); got["1"] != 2 || got["2"] != 1 || len(got) != 2 {
		t.Errorf("core NATS ids = %v, want 1 twice, 2 once", got)
	}
	testenv.Never(t, 100*time.Millisecond, "a duplicate stored in the stream", func() bool { return stream.Len() > 2 })
	if got := stream.MsgIDs(); got["1"] != 1 || got["2"] != 1 || len(got) != 2 {
		t.Errorf("stream ids = %v, want 1 and 2 once each", got)
	}
	if got := testenv.StreamMsgIDs(t, nc, "S", "s.note."); got["1"] != 1 || got["2"] != 1 || len(got) != 2 {
		t.Errorf("StreamMsgIDs = %v, want 1 and 2 once each", got)
	}
}

// TestVerifyNoneSeesALeak proves VerifyNone fails while a goroutine started by the test runs, and
// passes once it has stopped or when it is left out.
func TestVerifyNoneSeesALeak(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	nc := env.Conn(t) // a client the test owns: background, not a leak
	before := testenv.IgnoreCurrent()
	// Nor is the goroutine a subscription made since starts, though its stack spells the package
	// github.com/nats-io/nats%2ego.
	if _, err := nc.Subscribe("x", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); leaky(stop) }()

	if err := testenv.Leaks(before); err == nil || !strings.Contains(err.Error(), "testenv_test.leaky") {
		t.Errorf("Leaks with a goroutine running: got %v, want its stack named", err)
	}
	r := &fakeT{TB: t}
	testenv.VerifyNone(r, before, testenv.LeakTimeout(100*time.Millisecond))
	if got := r.message(); !strings.Contains(got, "testenv_test.leaky") {
		t.Errorf("VerifyNone with a goroutine running: got %q, want its stack named", got)
	}
	testenv.VerifyNone(t, before, testenv.IgnoreFuncs("github.com/sigwatch/sigwatch/internal/testenv_test.leaky"))
	close(stop)
	<-done
	testenv.VerifyNone(t, before)
	if err := testenv.Leaks(before); err != nil {
		t.Errorf("Leaks once stopped: %v", err)
	}
}

func leaky(stop chan struct{}) { <-stop }

// TestMetricReads proves Gathered and Scraped read counters, gauges by label and histograms,
// beside testutil.
func TestMetricReads(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "c_total", Help: "c"})
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "g", Help: "g"}, []string{"state"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds", Help: "h"})
	reg.MustRegister(c, g, h)
	c.Add(3)
	g.WithLabelValues("raised").Set(2)
	g.WithLabelValues("acked").Set(5)
	h.Observe(1)
	h.Observe(2)

	if got := testutil.ToFloat64(c); got != 3 {
		t.Errorf("ToFloat64(c) = %v, want 3", got)
	}
	if got := testenv.Observations(t, h); got != 2 {
		t.Errorf("Observations(h) = %v, want 2", got)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	for name, read := range map[string]func(string, ...string) float64{
		"Gathered": func(n string, l ...string) float64 { return testenv.Gathered(t, reg, n, l...) },
		"Scraped":  func(n string, l ...string) float64 { return testenv.Scraped(t, srv.URL, n, l...) },
	} {
		if got := read("c_total"); got != 3 {
			t.Errorf("%s c_total = %v, want 3", name, got)
		}
		if got := read("g", "state", "acked"); got != 5 {
			t.Errorf("%s g{state=acked} = %v, want 5", name, got)
		}
		if got := read("h_seconds"); got != 2 {
			t.Errorf("%s h_seconds = %v observations, want 2", name, got)
		}
	}
	if got := testenv.Series(t, reg, "g", "state"); len(got) != 2 || got["raised"] != 2 || got["acked"] != 5 {
		t.Errorf("Series(g, state) = %v, want raised 2, acked 5", got)
	}
	if got := testenv.Series(t, reg, "absent_total", "state"); len(got) != 0 {
		t.Errorf("Series of a metric not there = %v, want empty", got)
	}
	r := &fakeT{TB: t}
	testenv.Gathered(r, reg, "g")
	if got := r.message(); !strings.Contains(got, "has 2 series, want 1") {
		t.Errorf("Gathered of a vector without labels: got %q, want refused", got)
	}
}

// TestSecureServersTakeTheCredentials proves Options.Secure gives servers that speak TLS with
// credentials, and that Store, Conn and MQTT reach them with what Env holds.
func TestSecureServersTakeTheCredentials(t *testing.T) {
	creds := &testenv.Credentials{User: "u", Password: "p"}
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true, Secure: creds})
	if env.Secure != creds || env.ClientTLS == nil || env.Certs.CAFile == "" || env.Redis.TLSAddr == "" {
		t.Fatalf("got Secure %v, ClientTLS %v, Certs %+v, Redis TLS at %q; want all set", env.Secure, env.ClientTLS, env.Certs, env.Redis.TLSAddr)
	}
	ctx := context.Background()
	if _, _, err := env.Store(t, "sw").Score(ctx, shard.Deadlines, 0, "d"); err != nil {
		t.Errorf("store with the password: %v", err)
	}
	if _, err := env.Conn(t).RTT(); err != nil {
		t.Errorf("NATS over TLS with the user: %v", err)
	}
	if !strings.HasPrefix(env.Mosquitto.URL, "ssl://") {
		t.Errorf("mosquitto URL %q, want ssl://", env.Mosquitto.URL)
	}
	c := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID("secure").
		SetUsername("u").SetPassword("p").SetTLSConfig(env.ClientTLS))
	if !c.IsConnected() {
		t.Error("MQTT client with the credentials is not connected")
	}
	r := &fakeT{TB: t}
	testenv.MQTT(r, mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID("anonymous").
		SetTLSConfig(env.ClientTLS).SetAutoReconnect(false).SetConnectRetry(false))
	if !strings.Contains(r.message(), "MQTT connect") {
		t.Errorf("anonymous MQTT connect: got %q, want refused", r.message())
	}
}
