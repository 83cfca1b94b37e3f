// Package testenv gives a test, in one call, the real servers sigwatch runs against: a Redis
// always, and on request a Mosquitto broker and an embedded NATS (with JetStream, and optionally
// its MQTT listener). Each runs on 127.0.0.1 on a random port in the test's t.TempDir() and is
// stopped by t.Cleanup. A missing server binary fails the test with how to install it; tests
// never skip for it.
package testenv

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/servers"
)

// Options says which servers besides Redis a test needs.
type Options struct {
	Mosquitto bool // a Mosquitto broker, tuned as deploy/local/mosquitto.conf
	NATS      bool // an embedded nats-server with JetStream
	NATSMQTT  bool // the same, with its MQTT listener enabled (implies NATS)
	// RedisPersist turns on Redis's append-only file, for tests that Kill and Restart Redis and
	// expect the data back.
	RedisPersist bool
}

// Env is a test's set of running servers. Fields for servers not asked for are nil.
type Env struct {
	Redis     *servers.Redis
	Mosquitto *servers.Mosquitto
	NATS      *servers.NATS
}

// New starts the servers opts asks for, and Redis. They are killed when the test ends; when the
// test failed, the end of each server's log is written to the test log first.
func New(t testing.TB, opts Options) *Env {
	t.Helper()
	dir := t.TempDir()
	env := &Env{}

	r, err := servers.StartRedis(filepath.Join(dir, "redis"), servers.RedisOptions{Persist: opts.RedisPersist})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	env.Redis = r
	t.Cleanup(func() {
		logOnFailure(t, "redis", r.LogPath())
		if err := r.Kill(); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})

	if opts.Mosquitto {
		m, err := servers.StartMosquitto(filepath.Join(dir, "mosquitto"), servers.MosquittoOptions{})
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		env.Mosquitto = m
		t.Cleanup(func() {
			logOnFailure(t, "mosquitto", m.LogPath())
			if err := m.Kill(); err != nil {
				t.Errorf("testenv: %v", err)
			}
		})
	}

	if opts.NATS || opts.NATSMQTT {
		n, err := servers.StartNATS(filepath.Join(dir, "nats"), servers.NATSOptions{JetStream: true, MQTT: opts.NATSMQTT})
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		env.NATS = n
		t.Cleanup(func() {
			logOnFailure(t, "nats", n.LogPath())
			n.Shutdown()
		})
	}
	return env
}

// RedisCluster starts a Redis Cluster of masters nodes (at least 3) without replicas, stopped
// when the test ends.
func RedisCluster(t testing.TB, masters int) *servers.RedisCluster {
	t.Helper()
	c, err := servers.StartRedisCluster(t.TempDir(), masters)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		for i, n := range c.Nodes {
			logOnFailure(t, fmt.Sprintf("redis cluster node %d", i), n.LogPath())
		}
		c.Stop()
	})
	return c
}

// WaitFor polls cond every 10ms until it returns true, and fails the test if that takes longer
// than timeout. what completes the sentence "timed out waiting for ...". It must be called from
// the test's goroutine.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
			return
		}
		<-tick.C
	}
}

// logOnFailure writes the end of a server's log to the test log if the test failed, since the
// log itself is removed with the test's temporary directory.
func logOnFailure(t testing.TB, name, path string) {
	if !t.Failed() {
		return
	}
	t.Logf("testenv: end of %s log %s:\n%s", name, path, servers.LogTail(path))
}
