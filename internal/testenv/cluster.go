package testenv

import (
	"fmt"
	"testing"

	"github.com/sigwatch/sigwatch/internal/servers"
)

// RedisClusterWith starts a Redis Cluster as opts says (masters, replicas per master, node
// timeout, persistence), stopped when the test ends; when the test failed, the end of every
// node's log is written to the test log first.
func RedisClusterWith(t testing.TB, opts servers.ClusterOptions) *servers.RedisCluster {
	t.Helper()
	c, err := servers.StartRedisClusterOpts(t.TempDir(), opts)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	stopClusterWhenDone(t, c)
	return c
}

// stopClusterWhenDone stops c when the test ends, after writing the end of every node's log to
// the test log if the test failed.
func stopClusterWhenDone(t testing.TB, c *servers.RedisCluster) {
	t.Cleanup(func() {
		for i, n := range c.Nodes {
			logOnFailure(t, fmt.Sprintf("redis cluster node %d", i), n.LogPath())
		}
		c.Stop()
	})
}

// NATSCluster starts a three-node NATS cluster (each node a child process, JetStream on), stopped
// when the test ends; when the test failed, the end of every node's log is written first.
func NATSCluster(t testing.TB) *servers.NATSCluster {
	t.Helper()
	c, err := servers.StartNATSCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		for i := range 3 {
			logOnFailure(t, "nats node "+c.Name(i), c.LogPath(i))
		}
		c.Stop()
	})
	return c
}
