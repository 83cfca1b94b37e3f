package main

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// startAdvisoryProc starts a sigwatch that reads the NATS MQTT listener
// and follows its client advisories as the system account's user; devices
// are the clients dev-<id>, and their threshold is 5 minutes.
func startAdvisoryProc(t *testing.T, env *testenv.Env) string {
	t.Helper()
	addr := freeAddr(t)
	startProc(t, env, "sigwatch",
		"SIGWATCH_HTTP_ADDR="+addr,
		"SIGWATCH_MQTT_BROKERS="+env.NATS.MQTTURL,
		"SIGWATCH_MQTT_SHARED_GROUP=",
		"SIGWATCH_THRESHOLDS_DEFAULT=5m",
		"SIGWATCH_STORM_ENABLED=false",
		"SIGWATCH_MQTT_CONNECTIONS_ID_PATTERN=^dev-(.+)$",
		"SIGWATCH_NATS_ADVISORIES_ENABLED=true",
		"SIGWATCH_NATS_ADVISORIES_USER="+env.NATSSystem.User,
		"SIGWATCH_NATS_ADVISORIES_PASSWORD="+env.NATSSystem.Password,
	)
	waitAPI(t, addr)
	return addr
}

// advisoryDevice connects an MQTT client with client id id to url; it
// never reconnects by itself.
func advisoryDevice(t *testing.T, url, id string) mqtt.Client {
	t.Helper()
	return testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(url).SetClientID(id).
		SetAutoReconnect(false).SetConnectRetry(false).SetKeepAlive(30*time.Second))
}

func waitConnected(t *testing.T, addr, id string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, id+" watched by its connect advisory", func() bool {
		code, v := getDevice(t, addr, id)
		return code == 200 && v.Watched && !v.Lost
	})
}

// TestNATSDisconnectDeclaresLost: a device on the NATS MQTT listener whose
// TCP connection is cut is reported lost by the server's DISCONNECT
// advisory within 2 s, long before its 5-minute threshold, with reason
// disconnect; it never published anything (its CONNECT made it watched).
func TestNATSDisconnectDeclaresLost(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATSMQTT: true, NATSSystem: true})
	addr := startAdvisoryProc(t, env)
	lost := watchLost(t, env)

	proxy := testenv.NewProxy(t, env.NATS.MQTTAddr)
	advisoryDevice(t, "tcp://"+proxy.Addr, "dev-cut")
	waitConnected(t, addr, "cut")

	cut := time.Now()
	proxy.Cut(time.Hour)
	ev := lost.Wait(t, 10*time.Second, "cut lost", func(l dispatch.Lost) bool { return l.Device == "cut" })
	if ev.Body.Reason != shard.ReasonDisconnect {
		t.Errorf("cut lost with reason %q, want disconnect", ev.Body.Reason)
	}
	if took := ev.At.Sub(cut); took > 2*time.Second {
		t.Errorf("cut reported %v after its connection was cut; want within 2 s", took)
	} else {
		t.Logf("cut reported %v after its connection was cut (threshold 5m)", took.Round(time.Millisecond))
	}
}

// advisoryLog records the system account's advisories of one MQTT client,
// as they come.
type advisoryLog struct {
	mu  sync.Mutex
	raw []*nats.Msg
}

func (l *advisoryLog) find(subject string, start string) *nats.Msg {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.raw {
		if strings.HasSuffix(m.Subject, subject) && advisoryStart(m) == start {
			return m
		}
	}
	return nil
}

func advisoryStart(m *nats.Msg) string {
	var v struct {
		Client struct {
			Start string `json:"start"`
		} `json:"client"`
	}
	_ = json.Unmarshal(m.Data, &v)
	return v.Client.Start
}

// TestNATSStaleDisconnectIgnored: a device that connects again with its
// client id takes its session over; the server advises the new
// connection's CONNECT, then the old one's DISCONNECT, which is stale (an
// older connection start) and declares nothing. The same DISCONNECT
// arriving again later, as from another server of a cluster, declares
// nothing either. The new connection's own end does.
func TestNATSStaleDisconnectIgnored(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATSMQTT: true, NATSSystem: true})
	addr := startAdvisoryProc(t, env)
	lost := watchLost(t, env)
	sys := env.Conn(t, nats.UserInfo(env.NATSSystem.User, env.NATSSystem.Password))
	var log advisoryLog
	if _, err := sys.Subscribe("$SYS.ACCOUNT.APP.*", func(m *nats.Msg) {
		if strings.Contains(string(m.Data), `"client_id":"dev-re"`) {
			log.mu.Lock()
			log.raw = append(log.raw, m)
			log.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := sys.Flush(); err != nil {
		t.Fatal(err)
	}

	advisoryDevice(t, env.NATS.MQTTURL, "dev-re")
	waitConnected(t, addr, "re")
	var first *nats.Msg
	testenv.WaitFor(t, 5*time.Second, "the first connection's CONNECT", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		if len(log.raw) > 0 {
			first = log.raw[0]
		}
		return first != nil
	})
	oldStart := advisoryStart(first)

	// The device comes back on a new connection before the broker noticed
	// the old one is gone.
	proxy := testenv.NewProxy(t, env.NATS.MQTTAddr)
	advisoryDevice(t, "tcp://"+proxy.Addr, "dev-re")
	var stale *nats.Msg
	testenv.WaitFor(t, 5*time.Second, "the old connection's DISCONNECT", func() bool {
		stale = log.find(".DISCONNECT", oldStart)
		return stale != nil
	})
	log.mu.Lock()
	order := make([]string, 0, len(log.raw))
	for _, m := range log.raw {
		order = append(order, m.Subject[strings.LastIndexByte(m.Subject, '.')+1:])
	}
	log.mu.Unlock()
	if strings.Join(order, " ") != "CONNECT CONNECT DISCONNECT" {
		t.Fatalf("advisories came as %v, want CONNECT CONNECT DISCONNECT", order)
	}
	notLost := func(what string, d time.Duration) {
		testenv.Never(t, d, what, func() bool {
			return len(lost.Where(func(l dispatch.Lost) bool { return l.Device == "re" })) > 0
		})
	}
	notLost("re lost by its old connection's DISCONNECT", 2*time.Second)

	// The same DISCONNECT again, late.
	if err := sys.Publish(stale.Subject, stale.Data); err != nil {
		t.Fatal(err)
	}
	notLost("re lost by a late DISCONNECT of its old connection", 2*time.Second)
	staleSeen := testenv.Scraped(t, "http://"+addr+"/metrics", "sigwatch_ingest_stale_connection_events_total")
	if staleSeen < 2 {
		t.Errorf("stale connection events counted: %v, want at least 2", staleSeen)
	}
	if _, v := getDevice(t, addr, "re"); !v.Watched || v.Lost {
		t.Errorf("re after stale disconnects: %+v, want watched, not lost", v)
	}

	cut := time.Now()
	proxy.Cut(time.Hour)
	ev := lost.Wait(t, 10*time.Second, "re lost when its new connection ends", func(l dispatch.Lost) bool { return l.Device == "re" })
	if ev.Body.Reason != shard.ReasonDisconnect {
		t.Errorf("re lost with reason %q, want disconnect", ev.Body.Reason)
	}
	t.Logf("re reported %v after its new connection was cut", ev.At.Sub(cut).Round(time.Millisecond))
}
