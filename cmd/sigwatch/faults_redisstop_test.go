package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// route is one request of the outage test: a method and a path matching one
// pattern of the API's route table, with a body where the route needs one.
type route struct {
	method, pattern, path, body string
	// once marks a route that changes the deployment for good: it is
	// asked during the outage only.
	once bool
}

// outageRoutes is one request per /v1 route of api.Handler.
var outageRoutes = []route{
	{method: "GET", pattern: "/v1/devices", path: "/v1/devices"},
	{method: "GET", pattern: "/v1/alarms", path: "/v1/alarms"},
	{method: "GET", pattern: "/v1/devices/{id}", path: "/v1/devices/e2e-0000"},
	{method: "DELETE", pattern: "/v1/devices/{id}", path: "/v1/devices/never-seen"},
	{method: "PUT", pattern: "/v1/devices/{id}/threshold", path: "/v1/devices/e2e-0001/threshold", body: `{"threshold":"1h"}`},
	{method: "PUT", pattern: "/v1/devices/{id}/group", path: "/v1/devices/e2e-0001/group", body: `{"group":"g1"}`},
	{method: "POST", pattern: "/v1/devices/{id}/ack", path: "/v1/devices/e2e-0001/ack", body: `{}`},
	{method: "GET", pattern: "/v1/types", path: "/v1/types"},
	{method: "GET", pattern: "/v1/types/{type}", path: "/v1/types/t1"},
	{method: "PUT", pattern: "/v1/types/{type}", path: "/v1/types/t1", body: `{"threshold":"1h"}`},
	{method: "DELETE", pattern: "/v1/types/{type}", path: "/v1/types/t2"},
	{method: "GET", pattern: "/v1/mutes", path: "/v1/mutes"},
	{method: "POST", pattern: "/v1/mutes", path: "/v1/mutes", body: `{"type":"t-none","for":"1m"}`},
	{method: "DELETE", pattern: "/v1/mutes/{id}", path: "/v1/mutes/no-such-mute"},
	{method: "POST", pattern: "/v1/signals", path: "/v1/signals", body: `[{"device":"out-api"}]`},
	{method: "GET", pattern: "/v1/shards", path: "/v1/shards"},
	{method: "POST", pattern: "/v1/shards/double", path: "/v1/shards/double", once: true},
	{method: "GET", pattern: "/v1/stats", path: "/v1/stats"},
	{method: "GET", pattern: "/v1/whoami", path: "/v1/whoami"},
	{method: "GET", pattern: "/v1/storms", path: "/v1/storms"},
	{method: "POST", pattern: "/v1/groups/{group}/ack", path: "/v1/groups/g1/ack", body: `{}`},
	{method: "POST", pattern: "/v1/fleet/ack", path: "/v1/fleet/ack", body: `{}`},
	{method: "GET", pattern: "/v1/sinks", path: "/v1/sinks"},
	{method: "GET", pattern: "/v1/audit", path: "/v1/audit"},
	{method: "POST", pattern: "/v1/sinks/{name}/test", path: "/v1/sinks/none/test"},
	{method: "PUT", pattern: "/v1/timers/{queue}/{id...}", path: "/v1/timers/q1/t1", body: `{"after":"1h"}`},
	{method: "GET", pattern: "/v1/timers/{queue}/{id...}", path: "/v1/timers/q1/t1"},
	{method: "DELETE", pattern: "/v1/timers/{queue}/{id...}", path: "/v1/timers/q1/none"},
	{method: "POST", pattern: "/v1/timers/{queue}", path: "/v1/timers/q1", body: `[{"id":"t2","after":"1h"}]`},
}

// TestOutageRoutesCoverTheAPI: every /v1 route api.Routes declares is
// asked during the outage too.
func TestOutageRoutesCoverTheAPI(t *testing.T) {
	have := map[string]bool{"GET /v1/events": true} // asked by streamStarts
	for _, r := range outageRoutes {
		have[r.method+" "+r.pattern] = true
	}
	for _, r := range api.Routes(DefaultConfig().HTTP) {
		if k := r.Method + " " + r.Path; strings.HasPrefix(r.Path, "/v1/") && !have[k] {
			t.Errorf("route %s is not asked in the outage test: add it to outageRoutes", k)
		}
	}
}

// ask sends r to base and returns the status, the body and how long the
// answer took (status 0 when none came within the client's 10s).
func ask(base string, r route) (int, string, time.Duration) {
	req, _ := http.NewRequest(r.method, base+r.path, strings.NewReader(r.body))
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{Timeout: 10 * time.Second}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error(), time.Since(start)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), time.Since(start)
}

// TestRedisStoppedAPIAnswersFast freezes Redis (SIGSTOP) under a running
// process for 30s, the figure an operator met: every API route answers
// within 2s with a 503 that names Redis, the CLI returns with an error
// that names it, and the process logs at most 30 lines for the whole
// outage. Once Redis goes on, every route answers as it did before.
func TestRedisStoppedAPIAnswersFast(t *testing.T) {
	redisDown(t, 30*time.Second, false)
}

// TestRedisKilledAPIAnswersFast is the same with Redis gone (SIGKILL, then
// started again with its data): every call fails at once then, which is
// what flooded the log.
func TestRedisKilledAPIAnswersFast(t *testing.T) {
	redisDown(t, 15*time.Second, true)
}

func redisDown(t *testing.T, outage time.Duration, kill bool) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true, RedisPersist: kill})
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	base := "http://" + addr
	p := startProc(t, env, "a", "SIGWATCH_HTTP_ADDR="+addr, "SIGWATCH_LOG_LEVEL=info", "SIGWATCH_THRESHOLDS_DEFAULT=3s")
	startDevices(t, env.Mosquitto.URL, 20, 500*time.Millisecond)
	testenv.WaitFor(t, 20*time.Second, "readyz", func() bool {
		code, _, _ := ask(base, route{method: "GET", path: "/readyz"})
		return code == http.StatusOK
	})
	testenv.WaitFor(t, 10*time.Second, "a device watched", func() bool {
		code, _, _ := ask(base, route{method: "GET", path: "/v1/devices/e2e-0000"})
		return code == http.StatusOK
	})
	before := map[string]int{}
	for _, r := range outageRoutes {
		if r.once {
			continue
		}
		code, body, _ := ask(base, r)
		if code >= 500 || code == 0 {
			t.Fatalf("%s %s before the outage: %d %s", r.method, r.path, code, body)
		}
		before[r.method+" "+r.path] = code
	}

	logAt := fileSize(t, p.log)
	stop, cont := env.Redis.Pause, env.Redis.Resume
	if kill {
		stop, cont = env.Redis.Kill, env.Redis.Restart
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := cont(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)

	// At the start of the outage, before it is known, every route answers
	// within 2s: from what it had (a cached report), or 503 naming Redis.
	var wg sync.WaitGroup
	for _, r := range outageRoutes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body, took := ask(base, r)
			if code == 0 || took > 2*time.Second || code >= 500 && !strings.Contains(body, `"redis unavailable`) {
				t.Errorf("%s %s as Redis stops: %d %s after %v; want an answer within 2s, 503 naming Redis if any",
					r.method, r.path, code, body, took.Round(time.Millisecond))
			}
		}()
	}
	wg.Wait()
	for _, args := range [][]string{{"stats"}, {"device", "get", "e2e-0000"}} {
		start := time.Now()
		out, err := runCLITimed(t, addr, 10*time.Second, args...)
		took := time.Since(start)
		if err == nil || took > 2*time.Second || !strings.Contains(strings.ToLower(out), "redis unavailable") {
			t.Errorf("sigwatch %s with Redis stopped: %v after %v: %q; want an error naming Redis within 2s",
				strings.Join(args, " "), err, took.Round(time.Millisecond), out)
		}
	}
	// The event stream needs NATS alone: it goes on serving.
	if code, took := streamStarts(base); code != http.StatusOK {
		t.Errorf("GET /v1/events with Redis stopped: %d after %v, want the stream (200) within 2s", code, took.Round(time.Millisecond))
	}
	rounds := 0
	for time.Since(paused) < outage-3*time.Second {
		for _, r := range outageRoutes {
			code, body, took := ask(base, r)
			if code != http.StatusServiceUnavailable || took > 2*time.Second || !strings.Contains(body, `"redis unavailable`) {
				t.Errorf("%s %s at %v into the outage: %d %s after %v; want 503 naming Redis within 2s",
					r.method, r.path, time.Since(paused).Round(time.Millisecond), code, body, took.Round(time.Millisecond))
			}
		}
		rounds++
		time.Sleep(time.Second)
	}
	time.Sleep(time.Until(paused.Add(outage)))
	// The audit trail's lines are one per call the test itself made:
	// what is bounded here is the service's own noise.
	lines := slices.DeleteFunc(linesSince(t, p.log, logAt), func(l string) bool { return strings.Contains(l, "msg=audit ") })
	resume()
	t.Logf("asked every route %d times; the log during the %v outage holds %d lines:\n%s",
		rounds, outage, len(lines), strings.Join(lines, "\n"))
	if most := int(outage / time.Second); len(lines) > most {
		t.Errorf("got %d log lines during the outage, want at most %d", len(lines), most)
	}

	testenv.WaitFor(t, 20*time.Second, "every route answering as before", func() bool {
		for _, r := range outageRoutes {
			if r.once {
				continue
			}
			if code, _, _ := ask(base, r); code != before[r.method+" "+r.path] {
				return false
			}
		}
		return true
	})
	for _, r := range outageRoutes {
		if r.once {
			continue
		}
		if code, body, took := ask(base, r); code != before[r.method+" "+r.path] || took > 2*time.Second {
			t.Errorf("%s %s after the outage: %d %s after %v, want %d", r.method, r.path, code, body, took, before[r.method+" "+r.path])
		}
	}
}

// streamStarts says whether GET /v1/events at base starts its stream (200
// and the headers) within 2s.
func streamStarts(base string) (int, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/events?last=1", nil)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, time.Since(start)
	}
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// runCLITimed runs a sigwatch subcommand against the API at addr, killing
// it after limit.
func runCLITimed(t *testing.T, addr string, limit time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), "SIGWATCH_API=http://"+addr)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// linesSince returns the lines of the file at path after offset.
func linesSince(t *testing.T, path string, offset int64) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.TrimSpace(b[offset:])
	if len(b) == 0 {
		return nil
	}
	return strings.Split(string(b), "\n")
}
