package ingest

import (
	"os"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// Invariant 7: bad input never holds good input, not even while the
// dead-letter subject is unreachable. 2,000 malformed messages arrive during
// an 8 s NATS outage (more than the broker's in-flight window: Mosquitto's
// 1,000, the NATS MQTT listener's 1,024 per session); good devices
// signalling all along keep having their deadlines stored.
func TestBadInputDuringNATSOutageHoldsNoGoodInput(t *testing.T) {
	for _, broker := range []string{"mosquitto", "nats-mqtt"} {
		t.Run(broker, func(t *testing.T) { testBadInputDuringNATSOutage(t, broker) })
	}
}

func testBadInputDuringNATSOutage(t *testing.T, broker string) {
	r := newRig(t, testenv.Options{Mosquitto: broker == "mosquitto"})
	url := ""
	if broker == "mosquitto" {
		url = r.env.Mosquitto.URL
	} else {
		// The MQTT broker is a NATS server of its own, so that the
		// dead-letter NATS can go down without it.
		url = natsMQTT(t)
	}
	run := r.start(t, Options{ClientID: "ingest-badinput", Brokers: []string{url}})
	const threshold = 30 * time.Second // rig default

	good := []string{"good1", "good2", "good3"}
	dev := device(t, url)
	for _, id := range good {
		publish(t, dev, "devices/"+id+"/signal", "")
	}
	run.stored(t, len(good))

	// Good devices signal every 100 ms until the test ends.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	every(&wg, stop, 100*time.Millisecond, func() {
		for _, id := range good {
			dev.Publish("devices/"+id+"/signal", 1, false, "")
		}
	})
	defer func() { close(stop); wg.Wait() }()

	r.env.NATS.Shutdown()
	outage := time.Now()

	// 2,000 malformed messages (an empty id), from a client of their own.
	bad := device(t, url)
	toks := make([]mqtt.Token, 0, 2000)
	for range 2000 {
		toks = append(toks, bad.Publish("devices//signal", 1, false, "x"))
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish malformed: %v", tok.Error())
		}
	}
	testenv.WaitFor(t, 5*time.Second, "the malformed messages to reach ingest", func() bool {
		return testutil.ToFloat64(run.m.invalid["empty_id"]) >= 1000
	})

	// Throughout the rest of the outage, every good device's deadline is
	// fresh: at most staleMax behind a signal sent just now.
	const staleMax = 2 * time.Second
	worst := time.Duration(0)
	for time.Since(outage) < 8*time.Second {
		now := time.Now()
		for _, id := range good {
			dl, ok := r.deadline(t, id)
			if !ok {
				t.Fatalf("%s has no deadline", id)
			}
			stale := now.Sub(time.UnixMilli(dl - threshold.Milliseconds()))
			worst = max(worst, stale)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("during the outage: worst staleness of a good device's deadline %v; malformed received %v",
		worst, testutil.ToFloat64(run.m.invalid["empty_id"]))
	if worst > staleMax {
		t.Errorf("good devices' deadlines were up to %v stale during the NATS outage, want at most %v", worst, staleMax)
	}
	// The NATS MQTT listener parks what it cannot fit in a session's window
	// for its ack wait (30 s) even when ingest acks at once: there, more
	// than refusals could ever hold shows that they hold nothing.
	want := 2000.0
	if broker != "mosquitto" {
		want = invalidQueue + invalidBatch + 1
	}
	if n := testutil.ToFloat64(run.m.invalid["empty_id"]); n < want {
		t.Errorf("invalid_total{reason=empty_id} = %v by the end of the outage, want at least %v", n, want)
	}

	// What the bounded queue could not hold is counted, not kept.
	if n, got := testutil.ToFloat64(run.m.unforwarded), testutil.ToFloat64(run.m.invalid["empty_id"]); n < got-invalidQueue-invalidBatch {
		t.Errorf("invalid_unforwarded_total = %v, want at least %v", n, got-invalidQueue-invalidBatch)
	}
	if err := r.env.NATS.Restart(); err != nil {
		t.Fatal(err)
	}
	// Refused messages hold no in-flight slot.
	testenv.WaitFor(t, 5*time.Second, "nothing in flight", func() bool { return len(run.pipe.slots) == 0 })
}

// natsMQTT starts a nats-server with its MQTT listener, stopped when the
// test ends, and returns the listener's URL.
func natsMQTT(t *testing.T) string {
	t.Helper()
	if os.Getenv(protocolEnv) == Protocol5 {
		t.Skip("the NATS MQTT listener speaks MQTT 3.1.1 only")
	}
	n, err := servers.StartNATS(t.TempDir(), servers.NATSOptions{MQTT: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	return n.MQTTURL
}
