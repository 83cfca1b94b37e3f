package guard_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/guard"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// restartRig runs a guard on store, with the registry of env's NATS, and
// returns its metrics and log.
func restartRig(t *testing.T, env *testenv.Env, store *shard.Store) (*guard.Guard, *prometheus.Registry, *testenv.LogBuffer) {
	ctx := t.Context()
	pub, err := dispatch.New(ctx, env.Conn(t), dispatch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := pub.OpenRegistry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	metrics, log := prometheus.NewRegistry(), &testenv.LogBuffer{}
	g := guard.New(guard.Options{Store: store, Registry: reg, Pub: pub, Initial: 4,
		Thresholds: shard.NewThresholds(store, time.Minute, nil), Registerer: metrics,
		Log: slog.New(slog.NewTextHandler(log, nil))})
	if err := g.Establish(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	w, err := shard.NewWatcher(rctx, store, 4, 50*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.Watch(w, nil)
	done := make(chan error, 1)
	go func() { done <- g.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// The guard learns how Redis persists within a second of running.
	time.Sleep(1500 * time.Millisecond)
	return g, metrics, log
}

// TestCleanRestartKeepsGeneration: a Redis with appendfsync always stopped
// and started again is stamped again under the same generation; no loss,
// no restore.
func TestCleanRestartKeepsGeneration(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true, RedisPersist: true, RedisArgs: []string{"--appendfsync", "always"}})
	store := env.Store(t, "sw")
	_, metrics, log := restartRig(t, env, store)
	gen := store.Generation()
	if err := env.Redis.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the clean restart counted", func() bool {
		return testenv.Gathered(t, metrics, "sigwatch_redis_clean_restarts_total") == 1
	})
	if err := store.Vetted(t.Context(), 4); err != nil {
		t.Fatalf("not vetted after a clean restart: %v", err)
	}
	if got := store.Generation(); got != gen {
		t.Errorf("generation %s after a clean restart, want %s kept", got, gen)
	}
	if n := testenv.Gathered(t, metrics, "sigwatch_redis_data_loss_total"); n != 0 {
		t.Errorf("%v losses counted", n)
	}
	if strings.Contains(log.String(), "holding work") {
		t.Errorf("work held after a clean restart:\n%s", log)
	}
}

// TestFailoverIsNoCleanRestart: on a Redis Cluster whose nodes all fsync
// every write, a master killed and replaced by its replica is still a
// possible loss (replication is asynchronous): the guard restores, under a
// new generation.
func TestFailoverIsNoCleanRestart(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	cl := testenv.RedisClusterWith(t, servers.ClusterOptions{Masters: 3, Replicas: 1, AppendOnly: true, AppendFsync: "always"})
	store := testenv.StoreOn(t, cl.Addrs, "sw")
	_, metrics, log := restartRig(t, env, store)
	gen := store.Generation()
	m, err := cl.MasterOf("sw:{0}:dl")
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Kill(m); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitHealthy(t.Context()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "a restore under a new generation", func() bool {
		return store.Generation() != gen && store.Vetted(t.Context(), 4) == nil
	})
	if n := testenv.Gathered(t, metrics, "sigwatch_redis_clean_restarts_total"); n != 0 {
		t.Errorf("a failover counted as %v clean restarts", n)
	}
	if !strings.Contains(log.String(), "a failover") {
		t.Errorf("the restore's reason does not name the failover:\n%s", log)
	}
}
