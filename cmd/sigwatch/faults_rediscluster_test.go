package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestRedisClusterMasterFailover runs sigwatch on a Redis Cluster of three
// masters with one replica each and kills (-9) a master under a live fleet:
// its replica is promoted, the promotion is handled as a possible loss of
// the master's last writes, and the invariants of redisLoss hold.
func TestRedisClusterMasterFailover(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	cl := testenv.RedisClusterWith(t, servers.ClusterOptions{Masters: 3, Replicas: 1})
	r := startLossRun(t, env, "SIGWATCH_REDIS_ADDRS="+strings.Join(cl.Addrs, ","))
	r.silence()
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
	r.check(time.Now(), 16, false)
}
