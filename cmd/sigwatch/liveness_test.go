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
			app.live.stale.Store(int64(3 * time.Second))
			if code, body := healthz(t, app); code != http.StatusOK {
				t.Fatalf("healthz before the stall: %d %q, want 200", code, body)
			}
			release := sync.OnceFunc(app.live.stall(role))
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

// TestHealthzStaysOKWhileRedisIsDown: a dependency outage is readiness's
// business. With Redis hung (SIGSTOP: every call waits for its timeout and
// reconnects wait for the dial and handshake, the worst case for a loop),
// /readyz fails but /healthz stays 200 past the stale limit (30s), so
// Kubernetes does not restart pods for Redis's outage.
func TestHealthzStaysOKWhileRedisIsDown(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) { c.Scanner.LeaseTTL = time.Second })
	testenv.WaitFor(t, 10*time.Second, "ready", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})
	if err := env.Redis.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := env.Redis.Resume(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)

	stale := time.Duration(app.live.stale.Load())
	end := time.Now().Add(stale + 5*time.Second)
	notReady := false
	oldest := map[string]time.Duration{}
	for time.Now().Before(end) {
		for role, d := range app.live.ages() {
			oldest[role] = max(oldest[role], d)
		}
		if code, body := healthz(t, app); code != http.StatusOK {
			t.Fatalf("healthz while Redis is down: %d %q, want 200", code, body)
		}
		if code, _ := call(t, app, "GET", "/readyz", "", nil); code == http.StatusServiceUnavailable {
			notReady = true
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !notReady {
		t.Error("readyz never said 503 while Redis was down")
	}
	t.Logf("Redis hung for %s; the longest a loop went without progress: %v (stale limit %s)", stale+5*time.Second, oldest, stale)
	resume()
	testenv.WaitFor(t, 15*time.Second, "ready again", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})
	if code, body := healthz(t, app); code != http.StatusOK {
		t.Errorf("healthz after Redis is back: %d %q, want 200", code, body)
	}
}
