package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestRedisSentinelFailover runs sigwatch through three sentinels (a
// master and a replica) and kills (-9) the master under a live fleet:
// sigwatch follows the promotion, handles it as a possible loss of the
// master's last writes, and the invariants of redisLoss hold.
func TestRedisSentinelFailover(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	rs, err := servers.StartRedisSentinel(t.TempDir(), servers.SentinelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	r := startLossRun(t, env, "SIGWATCH_REDIS_ADDRS="+strings.Join(rs.SentinelAddrs(), ","),
		"SIGWATCH_REDIS_SENTINEL_MASTER_SET="+rs.MasterSet())
	r.silence()
	if _, err := rs.KillMaster(); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.WaitFailover(t.Context()); err != nil {
		t.Fatal(err)
	}
	r.check(time.Now(), 16, false)
}
