package ingest

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestBrokerDropsCountedOnce checks that sigwatch_ingest_broker_dropped_total
// counts only the drops the broker reports while this process listens: the
// drops of before it started (a sigwatch restart) and a broker restart that
// resets the broker's count add nothing, so an alert on its increase fires
// only on new drops.
func TestBrokerDropsCountedOnce(t *testing.T) {
	r := newRig(t, testenv.Options{})
	// A small queue, as Mosquitto's default has, so that the broker drops.
	m, err := servers.StartMosquitto(t.TempDir(), servers.MosquittoOptions{MaxQueuedMessages: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Kill() })

	// The broker's own count, as a test client reads it.
	var broker atomic.Int64
	broker.Store(-1)
	watch := mqtt.NewClientOptions().AddBroker(m.URL).SetClientID("drops-watch").
		SetAutoReconnect(true).SetConnectRetry(true).SetConnectRetryInterval(100 * time.Millisecond).
		SetOnConnectHandler(func(c mqtt.Client) {
			c.Subscribe(sysDropped, 0, func(_ mqtt.Client, msg mqtt.Message) {
				if n, err := strconv.ParseInt(strings.TrimSpace(string(msg.Payload())), 10, 64); err == nil {
					broker.Store(n)
				}
			})
		})
	testenv.MQTT(t, watch)
	testenv.WaitFor(t, 10*time.Second, "the broker's dropped count", func() bool { return broker.Load() >= 0 })

	// A persistent session that is away, with its queue full: every further
	// QoS 1 message for it is dropped.
	sinkOpts := mqtt.NewClientOptions().AddBroker(m.URL).SetClientID("drops-sink").SetCleanSession(false)
	sink := mqtt.NewClient(sinkOpts)
	if tok := sink.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("sink connect: %v", tok.Error())
	}
	if tok := sink.Subscribe("drops/x", 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("sink subscribe: %v", tok.Error())
	}
	sink.Disconnect(100)
	pubOpts := mqtt.NewClientOptions().AddBroker(m.URL).SetClientID("drops-pub").
		SetAutoReconnect(true).SetConnectRetry(true).SetConnectRetryInterval(100 * time.Millisecond)
	pub := testenv.MQTT(t, pubOpts)
	publish := func(n int) {
		t.Helper()
		for i := range n {
			if tok := pub.Publish("drops/x", 1, false, []byte(strconv.Itoa(i))); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
				t.Fatalf("publish: %v", tok.Error())
			}
		}
	}
	publish(5)
	// drop makes the broker drop n messages and waits until it says so.
	drop := func(n int) {
		t.Helper()
		before := broker.Load()
		publish(n)
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("the broker to count %d more drops than %d", n, before), func() bool {
			return broker.Load() == before+int64(n)
		})
	}

	// Drops from before this process started.
	drop(7)
	run := r.start(t, Options{Brokers: []string{m.URL}})
	gauge := func() float64 { return gatheredOr(t, run.reg, "sigwatch_ingest_broker_dropped_messages", -1) }
	counter := func() float64 { return gatheredOr(t, run.reg, "sigwatch_ingest_broker_dropped_total", -1) }
	testenv.WaitFor(t, 10*time.Second, "ingest to read the broker's count (7)", func() bool { return gauge() == 7 })
	testenv.Never(t, 1500*time.Millisecond, "old drops counted", func() bool { return counter() != 0 })
	if got := counter(); got != 0 {
		t.Fatalf("dropped_total = %v after starting with 7 old drops, want 0", got)
	}

	drop(3)
	testenv.WaitFor(t, 10*time.Second, "dropped_total to count the 3 new drops", func() bool { return counter() == 3 })

	// A broker restart resets its count: a new baseline, not a decrease.
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 15*time.Second, "ingest to read the restarted broker's count (0)", func() bool { return gauge() == 0 })
	// Whether or not the broker kept the sink's queue, at least 7 of 12 are
	// dropped, all after the new baseline.
	testenv.WaitFor(t, 10*time.Second, "the publisher to reconnect", pub.IsConnectionOpen)
	publish(12)
	// The broker reports once a second, possibly in the middle of the
	// drops: its count is final once it has not moved for two reports.
	last, since := int64(-1), time.Now()
	testenv.WaitFor(t, 15*time.Second, "the restarted broker to count its drops", func() bool {
		if n := broker.Load(); n != last {
			last, since = n, time.Now()
		}
		return last >= 7 && time.Since(since) > 2500*time.Millisecond
	})
	want := 3 + float64(broker.Load())
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("dropped_total to reach %v (3, then %d after the broker's restart)", want, broker.Load()),
		func() bool { return counter() == want })
	testenv.Never(t, 1500*time.Millisecond, "dropped_total to move without drops", func() bool { return counter() != want })
}

// gatheredOr is the value of the metric name in g, or def if g has none.
func gatheredOr(t *testing.T, g prometheus.Gatherer, name string, def float64) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.Metric) == 0 {
			continue
		}
		switch m := mf.Metric[0]; {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		}
	}
	return def
}

// TestNoMQTTMetricsWithoutBrokers checks that a process without MQTT
// brokers (signals over HTTP only) exports no MQTT metrics, so that an
// alert on them cannot fire for it; the others are there.
func TestNoMQTTMetricsWithoutBrokers(t *testing.T) {
	r := newRig(t, testenv.Options{})
	run := r.start(t, Options{})
	for _, name := range []string{"sigwatch_ingest_connected", "sigwatch_ingest_broker_dropped_total", "sigwatch_ingest_broker_dropped_messages"} {
		if got := gatheredOr(t, run.reg, name, math.NaN()); !math.IsNaN(got) {
			t.Errorf("%s = %v without brokers, want absent", name, got)
		}
	}
	if got := gatheredOr(t, run.reg, "sigwatch_ingest_watermark_age_seconds", math.NaN()); math.IsNaN(got) {
		t.Errorf("sigwatch_ingest_watermark_age_seconds absent without brokers, want present")
	}
}
