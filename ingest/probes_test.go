package ingest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// twoFilters are two device filters with the id at level 1.
var twoFilters = []string{"devices/+/signal", "sensors/+/beat"}

// onTwoFilters spreads the signals over both of twoFilters.
func onTwoFilters(k int) string {
	if k%2 == 0 {
		return fmt.Sprintf("devices/o%d/signal", k)
	}
	return fmt.Sprintf("sensors/o%d/beat", k)
}

// Invariant 8 with several filters, on every broker: while Redis is frozen
// and thousands of signals wait on both filters' subscriptions, no
// watermark vouches for one that is not stored. Each filter's subscription
// carries a probe of its own, and the watermark is the earliest of them.
// That is sound only if the broker keeps one order per session: on the NATS
// MQTT listener, a session's unacked window is shared by its subscriptions,
// and once it is full the listener skips a subscription's messages (for
// ack_wait, 30 s) while later ones pass — 976 of 8,000 signals were under
// the watermark before they were stored. There, Run refuses.
func TestWatermarkSeveralFilters(t *testing.T) {
	for _, broker := range brokers {
		t.Run(broker, func(t *testing.T) {
			r := newRig(t, testenv.Options{Mosquitto: broker == "mosquitto"})
			url := brokerURL(t, r, broker)
			opts := Options{Brokers: []string{url}, ClientID: "ingest-filters", Topics: twoFilters}
			if broker == "nats-mqtt" {
				refused(t, r, opts, "several filters")
				return
			}
			r.start(t, opts)
			if n := unstoredUnderWatermarkOn(t, r, url, nil, onTwoFilters); n != 0 {
				t.Errorf("%d signals were under the watermark before their deadline was stored, want 0", n)
			}
		})
	}
}

// What needs a broker that keeps one order per session is refused on the
// NATS MQTT listener, which does not, with a message that says why and
// what to change — for a shared group, instead of subscribing to a filter
// the listener takes literally and receiving nothing.
func TestUnorderedBrokerRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		why  string
	}{
		{"shared group", Options{SharedGroup: "g"}, `a shared group (mqtt.shared_group "g")`},
		{"id level not a +", Options{Topics: []string{"devices/#"}}, `filter "devices/#", whose level 1`},
		{"several filters", Options{Topics: twoFilters}, "several filters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, testenv.Options{})
			tc.opts.Brokers, tc.opts.ClientID = []string{natsMQTT(t)}, "ingest-refused"
			refused(t, r, tc.opts, tc.why)
		})
	}
}

// refused runs ingest with opts and checks that Run refuses the broker
// within a few seconds, saying why (want) and what to change.
func refused(t *testing.T, r *rig, opts Options, want string) {
	t.Helper()
	opts.Thresholds = r.thr
	in, err := New(opts, r.store, r.topo, r.pub, prometheus.NewRegistry(), testLog(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	in.drain = 500 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	select {
	case err = <-done:
	case <-time.After(identifyWait + 10*time.Second):
		cancel()
		<-done
		t.Fatalf("Run did not refuse the NATS MQTT listener")
	}
	if err == nil {
		t.Fatalf("Run returned nil, want a refusal")
	}
	t.Logf("Run: %v", err)
	for _, s := range []string{opts.Brokers[0], want, "one order", "mqtt.ordered_broker: true", "one filter with a '+' at mqtt.id_level"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Run's error does not say %q", s)
		}
	}
	if in.Connected() {
		t.Errorf("ingest reports itself connected after the refusal")
	}
}

// A shared group on Mosquitto, which identifies itself and keeps one order
// per session, runs: a signal is stored and the watermark passes it, and
// under back-pressure no watermark passes a signal not yet stored.
func TestSharedGroupOnMosquittoRuns(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	run := r.start(t, Options{ClientID: "ingest-shared", SharedGroup: "g"})
	watermarkPasses(t, r, run, r.env.Mosquitto.URL, "devices/m1/signal", "m1")
	if n := unstoredUnderWatermark(t, r, r.env.Mosquitto.URL, nil); n != 0 {
		t.Errorf("%d signals were under the watermark before their deadline was stored, want 0", n)
	}
}

// mqtt.ordered_broker: true lets the probe on a topic of its own run on a
// broker that does not identify itself as Mosquitto (here the NATS MQTT
// listener, with a filter whose id level is not a '+').
func TestOrderedBrokerVouched(t *testing.T) {
	r := newRig(t, testenv.Options{})
	url := natsMQTT(t)
	run := r.start(t, Options{Brokers: []string{url}, ClientID: "ingest-vouched", Topics: []string{"devices/#"}, OrderedBroker: true})
	watermarkPasses(t, r, run, url, "devices/v1/signal", "v1")
}

// watermarkPasses publishes one signal on topic and waits until it is
// stored for device id and the global watermark has passed it.
func watermarkPasses(t *testing.T, r *rig, run *running, url, topic, id string) {
	t.Helper()
	publish(t, device(t, url), topic, "")
	sent := time.Now().UnixMilli()
	run.stored(t, 1)
	if _, ok := r.deadline(t, id); !ok {
		t.Fatalf("no deadline stored for %q", id)
	}
	testenv.WaitFor(t, 10*time.Second, "the watermark past the signal", func() bool {
		wm, _, err := r.store.Watermarks().Read(t.Context())
		return err == nil && wm > sent
	})
}

// Which probes a configuration sends, and whether it needs a broker that
// keeps one order per session.
func TestProbeTopics(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    Options
		probes  []string
		ordered string // part of the reason, "" if none is needed
	}{
		{"one filter", Options{}, []string{"devices/$sigwatch-probe-c/signal"}, ""},
		{"one filter twice", Options{Topics: []string{"devices/+/signal", "devices/+/signal"}}, []string{"devices/$sigwatch-probe-c/signal"}, ""},
		{"two filters", Options{Topics: twoFilters},
			[]string{"devices/$sigwatch-probe-c/signal", "sensors/$sigwatch-probe-c/beat"}, "several filters"},
		{"overlapping", Options{Topics: []string{"a/+/x", "a/+/+"}}, []string{"sigwatch/probe/c"}, "overlapping filters"},
		{"shared group", Options{SharedGroup: "g"}, []string{"sigwatch/probe/c"}, "a shared group"},
		{"id level not a +", Options{Topics: []string{"devices/#"}}, []string{"sigwatch/probe/c"}, "is not a '+'"},
		{"own probe topic", Options{SharedGroup: "g", ProbeTopic: "p/c"}, []string{"p/c"}, "a shared group"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts
			o.ClientID, o.Thresholds = "c", shard.NewThresholds(nil, time.Minute, nil)
			if err := o.defaults(); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(o.probes) != fmt.Sprint(tc.probes) {
				t.Errorf("probes %q, want %q", o.probes, tc.probes)
			}
			if tc.ordered == "" && o.ordered != "" || !strings.Contains(o.ordered, tc.ordered) {
				t.Errorf("needs one order per session because %q, want %q", o.ordered, tc.ordered)
			}
		})
	}
}
