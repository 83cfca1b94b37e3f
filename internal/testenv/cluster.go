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
	t.Cleanup(func() {
		for i, n := range c.Nodes {
			logOnFailure(t, fmt.Sprintf("redis cluster node %d", i), n.LogPath())
		}
		c.Stop()
	})
	return c
}
