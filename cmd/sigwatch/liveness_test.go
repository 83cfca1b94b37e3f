package main

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

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
// the stale limit (shortened here to 3s), and 200 again once it moves.
func TestHealthzFailsWhenALoopStalls(t *testing.T) {
	for _, role := range []string{"scanner", "alarm"} {
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

// A dependency outage is readiness's business: with it down, /healthz stays
// 200, so Kubernetes does not restart pods for Redis's, NATS's or the
// broker's outage. The tests show it through the measured quantity /healthz
// is computed from: during the outage every loop still makes progress, the
// longest gap staying under bound, well below the stale limit (60s), where a
// loop stuck for the outage would show a gap as long as the outage.

// TestHealthzStaysOKWhileRedisIsDown: Redis hung (SIGSTOP: every call waits
// for its timeout and reconnects wait for the dial and handshake, the worst
// case for a loop: gaps of 6-20s measured).
func TestHealthzStaysOKWhileRedisIsDown(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	staysLive(t, env, "Redis hung", 45*time.Second, 40*time.Second, true, env.Redis.Pause, env.Redis.Resume)
}

// TestHealthzStaysOKWhileNATSIsDown: NATS shut down.
func TestHealthzStaysOKWhileNATSIsDown(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	staysLive(t, env, "NATS down", 10*time.Second, 5*time.Second, true,
		func() error { env.NATS.Shutdown(); return nil }, env.NATS.Restart)
}

// TestHealthzStaysOKWhileTheBrokerIsDown: Mosquitto hung. (A hung broker is
// noticed by the MQTT keepalive, not at once, so /readyz is not required to
// fail within the outage.)
func TestHealthzStaysOKWhileTheBrokerIsDown(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	staysLive(t, env, "Mosquitto hung", 10*time.Second, 5*time.Second, false, env.Mosquitto.Pause, env.Mosquitto.Resume)
}

// staysLive takes a dependency down with stop for down, and checks that
// /healthz answers 200 all along, that no loop goes longer than bound
// without progress, and (with wantNotReady) that /readyz says 503; then
// brings it back with start.
func staysLive(t *testing.T, env *testenv.Env, what string, down, bound time.Duration, wantNotReady bool, stop, start func() error) {
	app := startApp(t, env, func(c *Config) { c.Scanner.LeaseTTL = time.Second })
	stale := app.live.Stale()
	if bound >= stale || bound >= down {
		t.Fatalf("bound %s must be below the stale limit %s and the outage %s", bound, stale, down)
	}
	testenv.WaitFor(t, 10*time.Second, "ready", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
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

	end := time.Now().Add(down)
	notReady := false
	oldest := map[string]time.Duration{}
	for time.Now().Before(end) {
		for role, d := range app.live.Ages() {
			oldest[role] = max(oldest[role], d)
		}
		if code, body := healthz(t, app); code != http.StatusOK {
			t.Fatalf("healthz with %s: %d %q, want 200", what, code, body)
		}
		if code, _ := call(t, app, "GET", "/readyz", "", nil); code == http.StatusServiceUnavailable {
			notReady = true
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%s for %s; the longest a loop went without progress: %v (stale limit %s)", what, down, oldest, stale)
	for role, d := range oldest {
		if d >= bound {
			t.Errorf("%s: %s went %s without progress with %s, want under %s", role, role, d, what, bound)
		}
	}
	if wantNotReady && !notReady {
		t.Errorf("readyz never said 503 with %s", what)
	}
	restart()
	testenv.WaitFor(t, 20*time.Second, "ready again", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})
	if code, body := healthz(t, app); code != http.StatusOK {
		t.Errorf("healthz after the outage: %d %q, want 200", code, body)
	}
}
