package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestRedisRestartedGracefully stops Redis (SIGTERM: its append-only file
// written to the end) under a live fleet and starts it again with its
// data: the guard checks Redis against the durable registry, finds nothing
// missing and says so at info level; no error line, no redis_data_loss
// event, and every device is still watched.
func TestRedisRestartedGracefully(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true, RedisPersist: true})
	r := startLossRun(t, env)
	time.Sleep(lossThreshold)
	if err := env.Redis.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	const verdict = `level=INFO msg="Redis restarted; checked against the registry: nothing missing"`
	testenv.WaitFor(t, 30*time.Second, "the guard's verdict", func() bool {
		b, _ := os.ReadFile(r.proc.log)
		return strings.Contains(string(b), verdict)
	})
	waitHTTP(t, r.addr, "/readyz", 10*time.Second)
	neverLiveLost(t, r.lost, r.d, 2*lossThreshold)
	b, err := os.ReadFile(r.proc.log)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "level=ERROR") {
			t.Errorf("error line after a graceful restart: %s", l)
		}
	}
	for _, ev := range r.system.Bodies(nil) {
		if ev.Kind == "redis_data_loss" {
			t.Errorf("system event %+v after a graceful restart, want none", ev)
		}
	}
}
