package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// willDevice is a device that signals on devices/<id>/signal and keeps a
// status topic: online (retained) when it connects, offline as its MQTT
// will. It connects through a proxy of its own, so a test can freeze its
// connection as a pulled cable does.
type willDevice struct {
	id    string
	c     mqtt.Client
	proxy *testenv.Proxy
}

func newWillDevice(t *testing.T, env *testenv.Env, id string, keepAlive time.Duration) *willDevice {
	t.Helper()
	d := &willDevice{id: id, proxy: testenv.NewProxy(t, env.Mosquitto.Addr)}
	d.connect(t, keepAlive)
	return d
}

func (d *willDevice) connect(t *testing.T, keepAlive time.Duration) {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker("tcp://"+d.proxy.Addr).SetClientID("dev-"+d.id).
		SetKeepAlive(keepAlive).SetAutoReconnect(false).SetConnectRetry(false).
		SetWill("devices/"+d.id+"/status", "offline", 1, false)
	d.c = testenv.MQTT(t, o)
	d.publish(t, "status", "online", true)
	d.publish(t, "signal", "{}", false)
}

func (d *willDevice) publish(t *testing.T, leaf, payload string, retained bool) {
	t.Helper()
	if tok := d.c.Publish("devices/"+d.id+"/"+leaf, 1, retained, payload); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("%s: publish %s: %v", d.id, leaf, tok.Error())
	}
}

// presenceEnv is the settings of a sigwatch that reads status topics.
var presenceEnv = []string{
	"SIGWATCH_THRESHOLDS_DEFAULT=5m", "SIGWATCH_MQTT_STATUS_TOPICS=devices/+/status",
	"SIGWATCH_THRESHOLDS_CONFIRM_AFTER=slow=4s",
	"SIGWATCH_STORM_ENABLED=false",
}

// TestWillDeclaresLost: a device whose connection freezes is reported
// lost by its MQTT will within keep-alive x 1.5 + 1 s, long before its
// 5-minute threshold, with reason will; a device of a type with
// confirm_after that comes back inside the window is not reported at all,
// and one that does not is reported after it, saying so; the retained
// online the broker replays when sigwatch restarts does not revive a dead
// device.
func TestWillDeclaresLost(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	addr := freeAddr(t)
	p := startProc(t, env, "sigwatch", append([]string{"SIGWATCH_HTTP_ADDR=" + addr}, presenceEnv...)...)
	lost := watchLost(t, env)
	recovered := testenv.RecordStream[dispatch.Recovered](t, env.Conn(t), "SIGWATCH", "sigwatch.recovered.>")
	waitAPI(t, addr)

	const keepAlive = 2 * time.Second
	// The confirm_after devices are of type slow, which they get from a
	// signal through the API before they connect: their topics carry no
	// type, and a device keeps the type of its first signal.
	if code, body := apiCall(t, http.MethodPost, addr, "/v1/signals", "",
		`[{"device":"w-back","type":"slow"},{"device":"w-late","type":"slow"}]`); code != http.StatusOK {
		t.Fatalf("typing signals: %d %s", code, body)
	}
	dead := newWillDevice(t, env, "w-dead", keepAlive)
	back := newWillDevice(t, env, "w-back", keepAlive)
	late := newWillDevice(t, env, "w-late", keepAlive)
	testenv.WaitFor(t, 10*time.Second, "three devices watched", func() bool {
		for _, id := range []string{"w-dead", "w-back", "w-late"} {
			if _, v := getDevice(t, addr, id); !v.Watched || (id != "w-dead" && v.Type != "slow") {
				return false
			}
		}
		return true
	})

	// w-dead is killed: its socket closes, and the broker publishes its
	// will at once. The others' connections freeze, as a pulled cable
	// does: the broker publishes their wills once their keep-alive runs
	// out, which Mosquitto 2.0 checks only every few seconds.
	frozen := time.Now()
	dead.proxy.Cut(time.Hour)
	for _, d := range []*willDevice{back, late} {
		d.proxy.Hold()
	}
	ev := lost.Wait(t, 10*time.Second, "w-dead lost", func(l dispatch.Lost) bool { return l.Device == "w-dead" })
	if ev.Body.Reason != shard.ReasonWill {
		t.Errorf("w-dead lost with reason %q, want will", ev.Body.Reason)
	}
	if took := ev.At.Sub(frozen); took > keepAlive*3/2+time.Second {
		t.Errorf("w-dead reported %v after it was killed; want within keep-alive x 1.5 + 1 s", took)
	} else {
		t.Logf("w-dead reported %v after it was killed (threshold 5m)", took.Round(time.Millisecond))
	}
	// w-back reconnects inside its 4 s window: its will came, then online.
	back.proxy.Cut(0)
	back.proxy.Release()
	back.connect(t, keepAlive)
	lateEv := lost.Wait(t, 20*time.Second, "w-late lost", func(l dispatch.Lost) bool { return l.Device == "w-late" })
	t.Logf("w-late (connection frozen, confirm_after 4s) reported %v after it froze", lateEv.At.Sub(frozen).Round(time.Millisecond))
	if lateEv.Body.Reason != shard.ReasonWill || lateEv.Body.ConfirmAfter != 4000 {
		t.Errorf("w-late: reason %q confirm_after %d, want will after 4000 ms", lateEv.Body.Reason, lateEv.Body.ConfirmAfter)
	}
	if took := lateEv.At.Sub(frozen); took < 4*time.Second {
		t.Errorf("w-late reported %v after its connection froze, before its confirm_after of 4s", took)
	}
	testenv.Never(t, 5*time.Second, "w-back reported lost", func() bool {
		return len(lost.Where(func(l dispatch.Lost) bool { return l.Device == "w-back" })) > 0
	})

	// A restart replays w-dead's retained online: old news.
	p.stop()
	startProc(t, env, "sigwatch2", append([]string{"SIGWATCH_HTTP_ADDR=" + addr}, presenceEnv...)...)
	waitAPI(t, addr)
	testenv.Never(t, 3*time.Second, "w-dead revived by a replayed retained online", func() bool {
		_, v := getDevice(t, addr, "w-dead")
		return len(recovered.Where(func(r dispatch.Recovered) bool { return r.Device == "w-dead" })) > 0 || !v.Lost
	})
}

// TestDeclaredDeadlines: 1,000 devices declaring ttd 2 are reported at 2 s
// (their threshold is 5 minutes), with reason declared and never early;
// devices declaring ttd -1 stay until they send ttd 0, which reports them
// at once; a ttd beyond thresholds.max_declared is clamped and counted; a
// bad ttd is refused to sigwatch.invalid and stalls no one.
func TestDeclaredDeadlines(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	addr := freeAddr(t)
	startProc(t, env, "sigwatch", append([]string{"SIGWATCH_HTTP_ADDR=" + addr, "SIGWATCH_THRESHOLDS_MAX_DECLARED=1h"}, presenceEnv...)...)
	lost := watchLost(t, env)
	invalid := testenv.RecordStream[dispatch.Invalid](t, env.Conn(t), "SIGWATCH", "sigwatch.invalid")
	waitAPI(t, addr)
	c := connectMQTT(t, env.Mosquitto.URL, "ttd-fleet")
	send := func(id, payload string) time.Time {
		t.Helper()
		if tok := c.Publish("devices/"+id+"/signal", 1, false, payload); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", id, tok.Error())
		}
		return time.Now()
	}
	const n = 1000
	var mu sync.Mutex
	sent := map[string]time.Time{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for j := w; j < n; j += 4 {
				id := fmt.Sprintf("ttd2-%d", j)
				before := time.Now()
				send(id, `{"ttd": 2}`)
				mu.Lock()
				sent[id] = before
				mu.Unlock()
			}
		})
	}
	send("forever", `{"ttd": -1}`)
	send("clamped", `{"ttd": 86400}`)
	send("bad", `{"ttd": "soon"}`)
	wg.Wait()

	evs := lost.WaitN(t, 30*time.Second, n, "1,000 ttd devices lost", func(l dispatch.Lost) bool { return strings.HasPrefix(l.Device, "ttd2-") })
	var worst time.Duration
	for _, ev := range evs {
		if ev.Body.Reason != shard.ReasonDeclared {
			t.Fatalf("%s lost with reason %q, want declared", ev.Body.Device, ev.Body.Reason)
		}
		since := ev.At.Sub(sent[ev.Body.Device])
		if since < 2*time.Second {
			t.Fatalf("%s reported %v after its ttd 2 was sent: early", ev.Body.Device, since)
		}
		worst = max(worst, since)
	}
	t.Logf("1,000 devices with ttd 2: reported within %v of their message", worst.Round(time.Millisecond))
	if worst > 10*time.Second {
		t.Errorf("slowest ttd 2 device reported %v after its message; want 2 s and the fire lag, far from the 5m threshold", worst)
	}
	_, v := getDevice(t, addr, "clamped")
	if want := time.Now().Add(time.Hour).UnixMilli(); v.Deadline > want {
		t.Errorf("ttd 86400 kept a deadline %v away; want it clamped to max_declared 1h", time.Until(time.UnixMilli(v.Deadline)))
	}
	if got := familySum(scrapeFamilies(t, "http://"+addr+"/metrics")["sigwatch_ingest_declared_clamped_total"]); got != 1 {
		t.Errorf("sigwatch_ingest_declared_clamped_total = %v, want 1", got)
	}
	invalid.Wait(t, 10*time.Second, "the bad ttd refused", func(i dispatch.Invalid) bool { return i.Reason == "bad_ttd" })
	if len(lost.Where(func(l dispatch.Lost) bool { return l.Device == "forever" })) > 0 {
		t.Fatal("a device declaring ttd -1 was reported lost")
	}
	gone := send("forever", `{"ttd": 0}`)
	ev := lost.Wait(t, 10*time.Second, "forever lost after ttd 0", func(l dispatch.Lost) bool { return l.Device == "forever" })
	if ev.Body.Reason != shard.ReasonDeclared || ev.At.Sub(gone) > 2*time.Second {
		t.Errorf("ttd 0: reason %q after %v; want declared at once", ev.Body.Reason, ev.At.Sub(gone))
	}
}

// waitAPI waits until the process at addr is ready: ingest subscribed
// (a shared subscription drops what was published before it).
func waitAPI(t *testing.T, addr string) {
	t.Helper()
	testenv.WaitFor(t, 60*time.Second, "the process ready", func() bool {
		code, _ := apiCall(t, http.MethodGet, addr, "/readyz", "", nil)
		return code == http.StatusOK
	})
}

// getDevice reads one device through the API.
func getDevice(t *testing.T, addr, id string) (int, shard.DeviceView) {
	t.Helper()
	var v shard.DeviceView
	code, body := apiCall(t, http.MethodGet, addr, "/v1/devices/"+id, "", nil)
	if code == http.StatusOK {
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatalf("device %s: %v", id, err)
		}
	}
	return code, v
}
