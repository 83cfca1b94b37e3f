package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// cleanVerdict is the guard's line for a restart proven to have kept
// everything Redis acknowledged.
const cleanVerdict = `level=INFO msg="Redis restarted with everything it acknowledged in its append-only file; working on without a restore"`

// TestRedisRestartedGracefully stops Redis (SIGTERM) running with
// appendfsync always under a 2,000-device fleet (TEST_DEVICES sets another
// size; 10,000 is too many for the race detector beside the whole suite)
// and starts it again: the guard proves the restart kept everything and
// works on without a restore.
func TestRedisRestartedGracefully(t *testing.T) {
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("TEST_DEVICES")); err == nil && v >= 100 {
		n = v
	}
	cleanRestart(t, n, func(r *servers.Redis) error { return r.Stop() })
}

// TestRedisShutdownSaveRestarted is the same with SHUTDOWN SAVE.
func TestRedisShutdownSaveRestarted(t *testing.T) {
	cleanRestart(t, 2000, func(r *servers.Redis) error {
		port := r.Addr[strings.LastIndex(r.Addr, ":")+1:]
		// The connection closes as Redis exits: no reply is the answer.
		_ = exec.Command("redis-cli", "-p", port, "SHUTDOWN", "SAVE").Run()
		deadline := time.Now().Add(5 * time.Second)
		for exec.Command("redis-cli", "-p", port, "PING").Run() == nil {
			if time.Now().After(deadline) {
				t.Fatal("Redis still answers 5s after SHUTDOWN SAVE")
			}
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	})
}

// TestRedisAlwaysKilled is the same with SIGKILL: with appendfsync always
// every acknowledged write is on disk before its reply, so a crash of the
// Redis process loses nothing acknowledged either.
func TestRedisAlwaysKilled(t *testing.T) {
	cleanRestart(t, 2000, func(r *servers.Redis) error { return r.Kill() })
}

// cleanRestart stops Redis with stop and starts it again while devices are
// silenced around the restart: no restore (neither system event, no error
// line), no live device lost, every silenced device lost once at its own
// deadline (not re-armed a threshold later) within the time Redis was away
// plus the normal tolerance, and the clean restart counted.
func cleanRestart(t *testing.T, devices int, stop func(*servers.Redis) error) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true, RedisPersist: true,
		RedisArgs: []string{"--appendfsync", "always"}})
	r := startLossFleet(t, env, devices, time.Second)
	restartedClean(t, r, true, func() error {
		if err := stop(env.Redis); err != nil {
			return err
		}
		return env.Redis.Restart()
	})
}

// TestRedisClusterMasterRestartedClean restarts (SIGTERM) one master of a
// three-master Redis Cluster running with appendfsync always: its shards
// are proven whole and stamped again, without a restore.
func TestRedisClusterMasterRestartedClean(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	cl := testenv.RedisClusterWith(t, servers.ClusterOptions{Masters: 3, AppendOnly: true, AppendFsync: "always",
		NodeTimeout: 5 * time.Second})
	r := startLossFleet(t, env, 2000, time.Second, "SIGWATCH_REDIS_ADDRS="+strings.Join(cl.Addrs, ","))
	m, err := cl.MasterOf("sw:{0}:dl")
	if err != nil {
		t.Fatal(err)
	}
	// Three masters and their clients on two cores stamp and fire too
	// unevenly for the timing checks: they are the single Redis's.
	restartedClean(t, r, false, func() error {
		if err := m.Stop(); err != nil {
			return err
		}
		if err := cl.Restart(m); err != nil {
			return err
		}
		return cl.WaitHealthy(t.Context())
	})
}

// restartedClean restarts Redis under r's fleet with restart and checks
// what cleanRestart says (the timing only with timing).
func restartedClean(t *testing.T, r *lossRun, timing bool, restart func() error) {
	time.Sleep(lossThreshold)
	d := r.d
	// Their deadlines fall while Redis is away or just after.
	for i := 0; i < 20; i++ {
		d.silence(d.ids[i*100])
	}
	time.Sleep(2 * time.Second)
	down := time.Now()
	if err := restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	// Silenced with Redis back: their whole threshold runs after it.
	for i := 0; i < 20; i++ {
		d.silence(d.ids[i*100+1])
	}
	t.Logf("Redis away %v", back.Sub(down))
	testenv.WaitFor(t, 10*time.Second, "the guard's verdict", func() bool {
		b, _ := os.ReadFile(r.proc.log)
		return strings.Contains(string(b), cleanVerdict)
	})
	waitAllLost(t, r.lost, d, lossThreshold+lossLease+10*time.Second)
	neverLiveLost(t, r.lost, d, lossThreshold)
	checkExactlySilenced(t, r.lost, d, lossThreshold)
	// A lease that expired while Redis was away is taken again.
	const tolerance = lossLease + time.Second
	for _, e := range r.lost.Events() {
		if !timing {
			break
		}
		d.mu.Lock()
		last := d.last[e.Body.Device]
		d.mu.Unlock()
		// A signal that waited in ingest while Redis was away is stamped
		// when written, once it is back and ingest has retried.
		if last.After(down) && last.Before(back) {
			last = back.Add(time.Second)
		}
		// Ingest stamps a signal when it writes it: up to a second or so
		// after it was sent on a loaded machine. A restore would re-arm the
		// devices silenced before the restart a threshold after it.
		dl := time.UnixMilli(e.Body.Deadline)
		if dl.After(last.Add(lossThreshold + 2*time.Second)) {
			t.Errorf("device %s's deadline %v is more than 2s past its last signal %v + threshold: re-armed", e.Body.Device, dl, last)
		}
		due := dl
		if due.Before(back) {
			due = back
		}
		if late := e.At.Sub(due); late > tolerance {
			t.Errorf("device %s reported %v after its deadline (or Redis being back), want within %v", e.Body.Device, late, tolerance)
		}
	}
	_, _, worst := lags(r.lost)
	t.Logf("worst lag past the deadline %v", worst)
	b, err := os.ReadFile(r.proc.log)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "level=ERROR") || strings.Contains(l, "checked against the registry") ||
			strings.Contains(l, "holding work") {
			t.Errorf("after a clean restart: %s", l)
		}
	}
	for _, ev := range r.system.Bodies(nil) {
		if ev.Kind == "redis_data_loss" || ev.Kind == "redis_restored" {
			t.Errorf("system event %+v after a clean restart, want none", ev)
		}
	}
	if got := testenv.Scraped(t, "http://"+r.addr+"/metrics", "sigwatch_redis_clean_restarts_total"); got != 1 {
		t.Errorf("sigwatch_redis_clean_restarts_total %v, want 1", got)
	}
	if got := testenv.Scraped(t, "http://"+r.addr+"/metrics", "sigwatch_redis_data_loss_total"); got != 0 {
		t.Errorf("sigwatch_redis_data_loss_total %v, want 0", got)
	}
}
