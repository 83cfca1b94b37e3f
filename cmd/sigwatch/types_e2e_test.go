package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// typedConfig puts the device type in the topic: devices/<type>/<id>/signal.
func typedConfig(c *Config) {
	c.MQTT.Topics, c.MQTT.IDLevel, c.MQTT.TypeLevel = []string{"devices/+/+/signal"}, 2, 1
}

// typedFleet publishes a signal of every live device of one type every
// period, each acknowledged, and remembers when each was last sent.
type typedFleet struct {
	typ string
	ids []string

	mu     sync.Mutex
	silent map[string]bool
	last   map[string]time.Time // send time of the last acknowledged signal
	gap    time.Duration        // the longest between two acknowledged signals of a live device
}

// longestGap returns the longest time between two acknowledged signals of
// one live device so far: a threshold shorter than it may fire rightly.
func (f *typedFleet) longestGap() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gap
}

func startTypedFleet(t *testing.T, broker, typ string, n int, period time.Duration) *typedFleet {
	t.Helper()
	c := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(broker).SetClientID(fmt.Sprintf("fleet-%s-%d", typ, time.Now().UnixNano())).
		SetAutoReconnect(true).SetOrderMatters(false))
	f := &typedFleet{typ: typ, silent: map[string]bool{}, last: map[string]time.Time{}}
	for i := range n {
		f.ids = append(f.ids, fmt.Sprintf("%s-%04d", typ, i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			f.mu.Lock()
			var live []string
			for _, id := range f.ids {
				if !f.silent[id] {
					live = append(live, id)
				}
			}
			f.mu.Unlock()
			toks := make([]mqtt.Token, len(live))
			sent := make([]time.Time, len(live))
			for j, id := range live {
				sent[j] = time.Now()
				toks[j] = c.Publish("devices/"+typ+"/"+id+"/signal", 1, false, []byte{})
			}
			for j, tok := range toks {
				if tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
					f.mu.Lock()
					if prev, ok := f.last[live[j]]; ok {
						f.gap = max(f.gap, sent[j].Sub(prev))
					}
					f.last[live[j]] = sent[j]
					f.mu.Unlock()
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// silence stops id's signals and returns the send time of its last
// acknowledged one, once no signal of it can still be on its way.
func (f *typedFleet) silence(id string) time.Time {
	f.mu.Lock()
	f.silent[id] = true
	f.mu.Unlock()
	time.Sleep(300 * time.Millisecond)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last[id]
}

// putType sets a type's threshold through the API, failing on a refusal.
func putType(t *testing.T, app *App, typ string, body map[string]string) map[string]any {
	t.Helper()
	code, out := call(t, app, "PUT", "/v1/types/"+typ, "t0ken", body)
	if code != http.StatusOK {
		t.Fatalf("PUT /v1/types/%s %v: %d %v", typ, body, code, out)
	}
	return out
}

// TestTypeThresholdFlipNoLost proves invariants 1 and 2 for a type's
// threshold changed at run time: 200 devices of the type signalling every
// 100 ms while two writers flip its threshold between 2s and 4s for 8s are
// never lost; then one of them falls silent and the type's threshold is
// lowered to 2s: it is lost once, no sooner than 2s after its last signal
// and after the change, and soon after that, and no other device is. (A
// loaded machine has delayed the fleet's signals by up to 0.9s: 2s keeps
// a margin.)
func TestTypeThresholdFlipNoLost(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) {
		typedConfig(c)
		c.Thresholds.Default = time.Hour
		c.Thresholds.Types = map[string]time.Duration{"meter": 3 * time.Second}
	})
	waitReady(t, app)
	l := watchLost(t, env)
	f := startTypedFleet(t, env.Mosquitto.URL, "meter", 200, 100*time.Millisecond)
	waitWatched(t, app, f.ids)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mu sync.Mutex
	var flips, failed int
	for w := range 2 {
		wg.Go(func() {
			for k := w; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				code, out := call(t, app, "PUT", "/v1/types/meter", "t0ken", map[string]string{"threshold": []string{"2s", "4s"}[k%2]})
				mu.Lock()
				flips++
				if code != http.StatusOK {
					failed++
					t.Logf("flip refused: %d %v", code, out)
				}
				mu.Unlock()
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	time.Sleep(8 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d flips of the type's threshold, %d refused; the longest gap between two signals of a device: %v", flips, failed, f.longestGap())
	if failed > 0 {
		t.Errorf("got %d refused changes, want 0", failed)
	}
	if n := l.Len(); n > 0 {
		t.Fatalf("got %d lost events for devices signalling every 100ms (the longest gap %v) while their type's threshold flipped, want 0 (first: %+v)",
			n, f.longestGap(), l.Bodies(nil)[0])
	}

	putType(t, app, "meter", map[string]string{"threshold": "4s"})
	quiet := f.ids[0]
	last := f.silence(quiet)
	changed := time.Now()
	putType(t, app, "meter", map[string]string{"threshold": "2s"})
	ev := l.Wait(t, 10*time.Second, quiet+" lost", func(b dispatch.Lost) bool { return b.Device == quiet })
	fired := time.UnixMilli(ev.Body.FiredAt)
	if earliest := last.Add(2 * time.Second); time.UnixMilli(ev.Body.Deadline).Before(earliest) || fired.Before(earliest) {
		t.Errorf("%s lost at deadline %d, fired %d: before its last signal (%d) + 2s", quiet, ev.Body.Deadline, ev.Body.FiredAt, last.UnixMilli())
	}
	if fired.Before(changed.Add(2 * time.Second)) {
		t.Errorf("%s fired %v after the lowering, want no sooner than the new 2s", quiet, fired.Sub(changed))
	}
	if late := fired.Sub(changed); late > 4*time.Second {
		t.Errorf("%s fired %v after the lowering to 2s, want within about 2s, not after the old 4s", quiet, late)
	}
	time.Sleep(2 * time.Second)
	if n := l.Len(); n != 1 {
		t.Errorf("got %d lost events, want 1 (%s alone): %+v", n, quiet, l.Bodies(nil))
	}
}

// TestLoweredTypeThresholdFiresSilentDevice: a device of a type with a 20s
// threshold falls silent; a second later its type's threshold is lowered
// to 1s, and it is lost within about that second of the change, counted
// from its last signal, not after the old 20s.
func TestLoweredTypeThresholdFiresSilentDevice(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) {
		typedConfig(c)
		c.Thresholds.Default = time.Hour
		c.Thresholds.Types = map[string]time.Duration{"slow": 20 * time.Second}
	})
	waitReady(t, app)
	l := watchLost(t, env)
	f := startTypedFleet(t, env.Mosquitto.URL, "slow", 3, 100*time.Millisecond)
	waitWatched(t, app, f.ids)
	quiet := f.ids[1]
	last := f.silence(quiet)
	time.Sleep(time.Second)
	changed := time.Now()
	out := putType(t, app, "slow", map[string]string{"threshold": "1s"})
	if out["threshold_from"] != "runtime" || out["moved"] != float64(3) {
		t.Errorf("PUT answered %v, want threshold_from runtime and 3 deadlines moved", out)
	}
	ev := l.Wait(t, 6*time.Second, quiet+" lost", func(b dispatch.Lost) bool { return b.Device == quiet })
	fired := time.UnixMilli(ev.Body.FiredAt)
	t.Logf("lost %v after its last signal, %v after the change", fired.Sub(last), fired.Sub(changed))
	if time.UnixMilli(ev.Body.Deadline).Before(last.Add(time.Second)) || fired.Before(changed.Add(time.Second)) {
		t.Errorf("%s lost at deadline %d, fired %d: sooner than 1s after its last signal (%d) or the change", quiet, ev.Body.Deadline, ev.Body.FiredAt, last.UnixMilli())
	}
	if fired.Sub(changed) > 3*time.Second {
		t.Errorf("%s fired %v after the change to 1s, want within about 1s, not after the old 20s", quiet, fired.Sub(changed))
	}
	time.Sleep(1500 * time.Millisecond)
	if n := l.Len(); n != 1 {
		t.Errorf("got %d lost events, want 1 (%s alone): %+v", n, quiet, l.Bodies(nil))
	}
}

// TestTypeThresholdSurvivesRedisRestartedEmpty: a type's thresholds set
// through `sigwatch type set` are kept in the durable registry; after
// Redis is killed and started again empty they are in force again, said
// to be set at run time, and a device of the type that falls silent after
// the restore is lost by the set threshold (2s), not the config file's
// (20s); the live devices of the type are not lost.
func TestTypeThresholdSurvivesRedisRestartedEmpty(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	addr := freeAddr(t)
	startProc(t, env, "sigwatch", "SIGWATCH_HTTP_ADDR="+addr, "SIGWATCH_THRESHOLDS_DEFAULT=1h",
		"SIGWATCH_THRESHOLDS_TYPES=meter=20s", "SIGWATCH_THRESHOLDS_CONFIRM_AFTER=meter=1m",
		"SIGWATCH_MQTT_TOPICS=devices/+/+/signal", "SIGWATCH_MQTT_ID_LEVEL=2", "SIGWATCH_MQTT_TYPE_LEVEL=1")
	waitHTTP(t, addr, "/readyz", 30*time.Second)
	l := watchLost(t, env)
	system := testenv.RecordStream[dispatch.System](t, env.Conn(t), "SIGWATCH", "sigwatch.system")
	f := startTypedFleet(t, env.Mosquitto.URL, "meter", 20, 100*time.Millisecond)
	testenv.WaitFor(t, 20*time.Second, "the fleet watched", func() bool {
		code, body := apiCall(t, http.MethodGet, addr, "/v1/devices?type=meter&state=watched", "", nil)
		return code == http.StatusOK && strings.Count(body, `"device"`) == len(f.ids)
	})
	if out, err := runCLI(t, addr, "type", "set", "meter", "--threshold", "2s", "--confirm-after", "5s"); err != nil ||
		!strings.Contains(out, "2s") || !strings.Contains(out, "set at run time") {
		t.Fatalf("sigwatch type set: %v\n%s", err, out)
	}

	if err := env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	system.Wait(t, 60*time.Second, "redis_restored", func(s dispatch.System) bool { return s.Kind == "redis_restored" })
	waitHTTP(t, addr, "/readyz", 30*time.Second)

	code, body := apiCall(t, http.MethodGet, addr, "/v1/types/meter", "", nil)
	var v api.Type
	if err := json.Unmarshal([]byte(body), &v); code != http.StatusOK || err != nil {
		t.Fatalf("GET /v1/types/meter after the restore: %d %s", code, body)
	}
	if v.ThresholdMS != 2000 || v.ThresholdFrom != "runtime" || v.ConfirmAfterMS != 5000 || v.ConfirmAfterFrom != "runtime" {
		t.Errorf("meter after the restore: %+v, want threshold 2s and confirm_after 5s, both from runtime", v)
	}
	if out, err := runCLI(t, addr, "type", "ls"); err != nil || !strings.Contains(out, "meter") || !strings.Contains(out, "runtime") {
		t.Errorf("sigwatch type ls after the restore: %v\n%s", err, out)
	}

	// The restore re-armed every device a full threshold after the
	// outage: a silence from now on is judged by the set 2s.
	time.Sleep(3 * time.Second)
	quiet := f.ids[3]
	last := f.silence(quiet)
	ev := l.Wait(t, 10*time.Second, quiet+" lost", func(b dispatch.Lost) bool { return b.Device == quiet })
	fired := time.UnixMilli(ev.Body.FiredAt)
	t.Logf("lost %v after its last signal", fired.Sub(last))
	if ev.Body.Deadline < last.Add(2*time.Second).UnixMilli() {
		t.Errorf("%s lost at deadline %d, before its last signal (%d) + 2s", quiet, ev.Body.Deadline, last.UnixMilli())
	}
	if fired.Sub(last) > 5*time.Second {
		t.Errorf("%s lost %v after its last signal, want about the set 2s, not the config file's 20s", quiet, fired.Sub(last))
	}
	time.Sleep(time.Second)
	if n := l.Len(); n != 1 {
		t.Errorf("got %d lost events, want 1 (%s alone): %+v", n, quiet, l.Bodies(nil))
	}
}
