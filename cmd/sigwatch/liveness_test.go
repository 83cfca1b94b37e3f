package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/internal/periodic"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

func healthz(t *testing.T, app *App) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + app.HTTPAddr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHealthzFailsWhenALoopStalls: /healthz, the liveness probe, answers 503
// naming the role once a long-running loop makes no progress for longer than
// the stale limit (shortened here to 3s), and 200 again once it moves. The
// loops are stalled at their next beat (Liveness.Stall): ingest's flush
// loops inside a flush, before a store attempt, or while they wait for work.
func TestHealthzFailsWhenALoopStalls(t *testing.T) {
	for _, role := range []string{"scanner", "alarm", "ingest"} {
		t.Run(role, func(t *testing.T) {
			env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
			app := startApp(t, env, func(c *Config) { c.Scanner.LeaseTTL = time.Second })
			app.live.SetStale(3 * time.Second)
			if code, body := healthz(t, app); code != http.StatusOK {
				t.Fatalf("healthz before the stall: %d %q, want 200", code, body)
			}
			release := sync.OnceFunc(app.live.Stall(role))
			t.Cleanup(release) // before the app stops: a stalled loop cannot
			stalledAt := time.Now()
			var code int
			var body string
			testenv.WaitFor(t, 15*time.Second, "healthz 503", func() bool {
				code, body = healthz(t, app)
				return code == http.StatusServiceUnavailable
			})
			// The last beat came at most one rebalance period (500ms) before the stall.
			if waited := time.Since(stalledAt); waited < 3*time.Second-500*time.Millisecond {
				t.Errorf("healthz failed %s after the stall, before the stale limit (3s)", waited)
			}
			if !strings.Contains(body, role) {
				t.Errorf("healthz body %q does not name the stalled role %s", body, role)
			}
			release()
			testenv.WaitFor(t, 5*time.Second, "healthz 200 after the release", func() bool {
				code, body = healthz(t, app)
				return code == http.StatusOK
			})
		})
	}
}

// TestHealthzFailsWithinTheLimitWhenIngestWedges: with the limit as
// configured (15s by default), ingest's flush loops wedged fail /healthz
// within it, naming ingest, while signals go unstored.
func TestHealthzFailsWithinTheLimitWhenIngestWedges(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, nil)
	limit := app.live.Stale()
	if limit > 15*time.Second {
		t.Fatalf("liveness limit %s, want at most 15s", limit)
	}
	if code, body := healthz(t, app); code != http.StatusOK {
		t.Fatalf("healthz before the wedge: %d %q, want 200", code, body)
	}
	// Subscribed before the device publishes: a signal the broker has no
	// subscriber for yet is dropped, and would never be stored.
	waitHTTP(t, app.HTTPAddr(), "/readyz", 10*time.Second)
	release := sync.OnceFunc(app.live.Stall("ingest"))
	t.Cleanup(release)
	wedged := time.Now()
	dev := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID("wedge-device"))
	if tok := dev.Publish("devices/wedge-1/signal", 1, false, "1"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	var body string
	testenv.WaitFor(t, limit+5*time.Second, "healthz 503", func() bool {
		var code int
		code, body = healthz(t, app)
		return code == http.StatusServiceUnavailable
	})
	waited := time.Since(wedged)
	t.Logf("ingest wedged: healthz 503 after %s (limit %s): %q", waited.Round(time.Millisecond), limit, body)
	// The last beat came at most a second (the idle beat) before the wedge,
	// so /healthz fails at most the limit after it; the test's polling may
	// see it up to a second later on a loaded machine.
	if waited > limit+time.Second || waited < limit-time.Second-250*time.Millisecond {
		t.Errorf("healthz failed %s after ingest wedged, want within the limit %s (and not before it, less the idle beat)", waited, limit)
	}
	if !strings.Contains(body, "ingest") {
		t.Errorf("healthz body %q does not name ingest", body)
	}
	if code, _ := call(t, app, "GET", "/v1/devices/wedge-1", "t0ken", nil); code != http.StatusNotFound {
		t.Errorf("a device's signal was stored with ingest wedged: GET its device %d, want 404", code)
	}
	release()
	testenv.WaitFor(t, 5*time.Second, "healthz 200 after the release", func() bool {
		code, _ := healthz(t, app)
		return code == http.StatusOK
	})
	testenv.WaitFor(t, 5*time.Second, "the signal stored after the release", func() bool {
		code, _ := call(t, app, "GET", "/v1/devices/wedge-1", "t0ken", nil)
		return code == http.StatusOK
	})
}

// A dependency outage is readiness's business: with it down, /healthz stays
// 200, so Kubernetes does not restart pods for Redis's, NATS's or the
// broker's outage. The tests show it through the measured quantity /healthz
// is computed from: during the outage every loop still makes progress, the
// longest gap staying under bound, well below the stale limit (15s), where a
// loop stuck for the outage would show a gap as long as the outage.

// TestHealthzStaysOKWhileRedisIsDown: Redis hung (SIGSTOP) for 30s under
// signals: every call waits for its deadline and reconnects cannot finish
// their handshake. No Redis call of the process (on either of its two
// connections) returns later than its deadline plus a scheduling margin, no
// loop goes 7s without progress (ingest's flush retries every 3-4s; the
// alarm went 20s before the calls were bounded), /readyz names Redis, and
// not the broker, whose probes wait behind a full pipeline.
func TestHealthzStaysOKWhileRedisIsDown(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	// A pipeline this small fills during the outage: ingest stops reading
	// from the broker, which is not the broker's fault. (paho, whose reader
	// then waits too, may also miss a keep-alive answer and reconnect:
	// "mqtt: not connected" is true then.)
	smallPipeline := func(c *Config) { c.Ingest.MaxInFlight = 8 }
	app := staysLive(t, env, "Redis hung", 30*time.Second, 7*time.Second,
		outage{problem: "redis:", within: 5 * time.Second, never: "mqtt: the broker", mutate: smallPipeline}, env.Redis.Pause, env.Redis.Resume)
	over := max(app.store.LongestOverrun(), app.scanStore.LongestOverrun())
	t.Logf("the longest any Redis call of the process returned past its deadline: %s", over)
	// The margin is scheduling on a loaded machine; a reconnect held callers
	// seconds past their deadline before the calls were bounded.
	if over > 500*time.Millisecond {
		t.Errorf("a Redis call returned %s past its deadline with Redis hung, want at most 500ms", over)
	}
}

// TestHealthzStaysOKWhileNATSIsDown: NATS shut down.
func TestHealthzStaysOKWhileNATSIsDown(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	staysLive(t, env, "NATS down", 10*time.Second, 5*time.Second, outage{problem: "nats:", within: 5 * time.Second},
		func() error { env.NATS.Shutdown(); return nil }, env.NATS.Restart)
}

// TestHealthzStaysOKWhileTheBrokerIsDown: Mosquitto hung (SIGSTOP). paho
// notices only when a keep-alive goes unanswered (15-35s); /readyz names the
// broker once ingest's probes go unanswered, well within twice the
// keep-alive, and is ready again once the broker is back.
func TestHealthzStaysOKWhileTheBrokerIsDown(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	staysLive(t, env, "Mosquitto hung", 12*time.Second, 5*time.Second, outage{problem: "mqtt: the broker " + env.Mosquitto.URL, within: 10 * time.Second},
		env.Mosquitto.Pause, env.Mosquitto.Resume)
}

// outage is what /readyz must say of one: a problem starting with problem,
// within that long of its start, and never one starting with never (if
// set); mutate, if set, changes the process's configuration.
type outage struct {
	problem string
	within  time.Duration
	never   string
	mutate  func(*Config)
}

// staysLive takes a dependency down with stop for down, and checks that
// /healthz answers 200 all along, that no loop goes longer than bound
// without progress, and that /readyz names the outage (want) in time; then
// brings it back with start and waits for /readyz to be 200 again.
func staysLive(t *testing.T, env *testenv.Env, what string, down, bound time.Duration, want outage, stop, start func() error) *App {
	app := startApp(t, env, func(c *Config) {
		c.Scanner.LeaseTTL = time.Second
		if want.mutate != nil {
			want.mutate(c)
		}
	})
	stale := app.live.Stale()
	if bound >= stale || bound >= down {
		t.Fatalf("bound %s must be below the stale limit %s and the outage %s", bound, stale, down)
	}
	testenv.WaitFor(t, 10*time.Second, "ready", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})
	// A device signals all along, so that ingest's flush loops work (and
	// retry) through the outage instead of idling.
	dev := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID("liveness-device"))
	signalling, stopSignals := context.WithCancel(t.Context())
	var signals sync.WaitGroup
	defer signals.Wait()
	defer stopSignals()
	signals.Go(func() {
		periodic.Run(signalling, 100*time.Millisecond, func(time.Time) { dev.Publish("devices/live-1/signal", 1, false, "1") })
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	started := false
	restart := func() {
		if !started {
			started = true
			if err := start(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(restart)

	end := stopped.Add(down)
	var named time.Duration // when /readyz first named the outage
	var problems []any
	wrong := "" // the first problem named that want.never rules out
	oldest := map[string]time.Duration{}
	for time.Now().Before(end) {
		for role, d := range app.live.Ages() {
			oldest[role] = max(oldest[role], d)
		}
		if code, body := healthz(t, app); code != http.StatusOK {
			t.Fatalf("healthz with %s: %d %q, want 200", what, code, body)
		}
		if code, body := call(t, app, "GET", "/readyz", "", nil); code == http.StatusServiceUnavailable {
			ps, _ := body["problems"].([]any)
			for _, p := range ps {
				s, _ := p.(string)
				if strings.HasPrefix(s, want.problem) && named == 0 {
					named, problems = time.Since(stopped), ps
				}
				if want.never != "" && strings.HasPrefix(s, want.never) && wrong == "" {
					wrong = s
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%s for %s; the longest a loop went without progress: %v (stale limit %s); readyz named it after %s: %q",
		what, down, oldest, stale, named.Round(time.Millisecond), problems)
	for role, d := range oldest {
		if d >= bound {
			t.Errorf("%s: %s went %s without progress with %s, want under %s", role, role, d, what, bound)
		}
	}
	if wrong != "" {
		t.Errorf("readyz with %s said %q", what, wrong)
	}
	switch {
	case named == 0:
		t.Errorf("readyz never named %q with %s (problems %q)", want.problem, what, problems)
	case named > want.within:
		t.Errorf("readyz named %q %s after %s, want within %s", want.problem, named, what, want.within)
	}
	restart()
	back := time.Now()
	testenv.WaitFor(t, 20*time.Second, "ready again", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})
	t.Logf("ready again %s after %s ended", time.Since(back).Round(time.Millisecond), what)
	if code, body := healthz(t, app); code != http.StatusOK {
		t.Errorf("healthz after the outage: %d %q, want 200", code, body)
	}
	return app
}
