package ingest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

func TestParseConnEvent(t *testing.T) {
	for _, c := range []struct {
		topic, payload string
		want           ConnEvent
		err            error
	}{
		{"$SYS/brokers/n1/clients/dev-1/connected", `{"clientid":"dev-1","connected_at":1700000000123}`, ConnEvent{"dev-1", true, 1700000000123}, nil},
		{"$SYS/brokers/n1/clients/dev-1/disconnected", `{"clientid":"dev-1","reason":"keepalive_timeout","connected_at":5}`, ConnEvent{"dev-1", false, 5}, nil},
		{"$aws/events/presence/disconnected/dev-2", `{"clientId":"dev-2","eventType":"disconnected","versionNumber":7}`, ConnEvent{"dev-2", false, 7}, nil},
		{"$aws/events/presence/connected/dev-2", `{"clientId":"dev-2","eventType":"connected","versionNumber":0}`, ConnEvent{"dev-2", true, 0}, nil},
		{"x/connected", `{"clientid":""}`, ConnEvent{}, ErrBadConnEvent},
		{"x/y", `{"clientid":"a"}`, ConnEvent{}, ErrBadConnEvent},
		{"x/connected", `not json`, ConnEvent{}, ErrBadConnEvent},
		{"x/connected", `{"clientid":"a","versionNumber":-1}`, ConnEvent{}, ErrBadConnEvent},
	} {
		got, err := ParseConnEvent(c.topic, []byte(c.payload))
		if !errors.Is(err, c.err) || got != c.want {
			t.Errorf("%s %s: got %+v, %v; want %+v, %v", c.topic, c.payload, got, err, c.want, c.err)
		}
	}
}

// TestConnectionEvents: EMQX-shaped connection events through the broker
// (on a topic a client may publish; EMQX's own are under $SYS): a connect
// watches the device, a disconnect brings its deadline down to now, a
// disconnect of an older connection (a lower version) or a repeat changes
// nothing, a client id the pattern does not match is no device, and a bad
// event is refused.
func TestConnectionEvents(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	run := r.start(t, Options{Connections: ConnectionsConfig{Topics: []string{"emqx/brokers/+/clients/+/+"}, IDPattern: "^dev-(.+)$"}})
	c := device(t, r.env.Mosquitto.URL)
	ev := func(client, state string, version int64) {
		publish(t, c, fmt.Sprintf("emqx/brokers/n1/clients/%s/%s", client, state), fmt.Sprintf(`{"clientid":%q,"connected_at":%d}`, client, version))
	}
	ev("dev-a", "connected", 100)
	ev("dev-b", "connected", 100)
	ev("dashboard", "connected", 100)
	run.stored(t, 2)
	if _, ok := r.deadline(t, "dashboard"); ok {
		t.Error("a client the pattern does not match was watched")
	}
	a0, _ := r.deadline(t, "a")
	b0, _ := r.deadline(t, "b")

	// b reconnected (version 200) before the broker's report of its first
	// connection's end came through: that report is stale.
	ev("dev-b", "connected", 200)
	ev("dev-b", "disconnected", 100)
	before := time.Now()
	ev("dev-a", "disconnected", 100)
	ev("dev-a", "disconnected", 100)
	testenv.WaitFor(t, 5*time.Second, "a's deadline down", func() bool {
		d, _ := r.deadline(t, "a")
		return d < a0
	})
	if d, _ := r.deadline(t, "a"); d > time.Now().UnixMilli() || d < before.Add(-time.Second).UnixMilli() {
		t.Errorf("a's deadline %d after its disconnect at %d; want the disconnect's time", d, before.UnixMilli())
	}
	testenv.WaitFor(t, 5*time.Second, "the stale and repeated reports counted", func() bool {
		return testutil.ToFloat64(run.m.staleConns) == 2
	})
	if d, _ := r.deadline(t, "b"); d < b0 {
		t.Errorf("b's deadline came down (%d < %d) by a stale disconnect", d, b0)
	}
	publish(t, c, "emqx/brokers/n1/clients/dev-c/connected", "garbage")
	testenv.WaitFor(t, 5*time.Second, "the bad event refused", func() bool {
		return testutil.ToFloat64(run.m.invalid["bad_connection_event"]) == 1
	})
}
