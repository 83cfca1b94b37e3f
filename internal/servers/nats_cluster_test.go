package servers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/internal/servers"
)

// TestNATSClusterKillAndRestart starts a three-node cluster with a stream of three replicas,
// kills with -9 the node a client is connected to and then the stream's leader, restarting each
// in place: the client moves to a live node, a new leader is elected, the restarted nodes come
// back on their addresses, and every message the stream acknowledged is still there.
func TestNATSClusterKillAndRestart(t *testing.T) {
	c, err := servers.StartNATSCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i := range 3 {
				t.Logf("end of node %d log:\n%s", i, servers.LogTail(c.LogPath(i)))
			}
		}
		c.Stop()
	})
	urls := c.URLs()
	nc, err := nats.Connect(c.URL(), nats.Name("probe"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx(t), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3}); err != nil {
		t.Fatalf("create stream of 3 replicas: %v", err)
	}

	acked := 0
	// publish publishes one message, retrying while the cluster fails over, and counts it once
	// acknowledged.
	publish := func() {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			pctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := js.Publish(pctx, "t.x", []byte("m"), jetstream.WithMsgID(fmt.Sprint("m", acked)))
			cancel()
			if err == nil {
				acked++
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("publish after failover: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	node := func(what string, f func() (int, error), not int) int {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			i, err := f()
			if err == nil && i >= 0 && i != not {
				return i
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s other than node %d after 20s: got %d, %v", what, not, i, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	connected := func() (int, error) { return c.ConnectedNode("probe") }
	leader := func() (int, error) { return c.StreamLeader("T") }
	for range 10 {
		publish()
	}

	first := node("connected node", connected, -1)
	killed := time.Now()
	if err := c.Kill(first); err != nil {
		t.Fatal(err)
	}
	moved := node("connected node", connected, first)
	publish()
	t.Logf("client moved from %s to %s and published %v after the kill", c.Name(first), c.Name(moved), time.Since(killed).Round(time.Millisecond))
	if err := c.Restart(first); err != nil {
		t.Fatal(err)
	}

	lead := node("stream leader", leader, -1)
	killed = time.Now()
	if err := c.Kill(lead); err != nil {
		t.Fatal(err)
	}
	next := node("stream leader", leader, lead)
	publish()
	t.Logf("leader moved from %s to %s and took a publish %v after the kill", c.Name(lead), c.Name(next), time.Since(killed).Round(time.Millisecond))
	if err := c.Restart(lead); err != nil {
		t.Fatal(err)
	}

	if got := c.URLs(); !slices.Equal(got, urls) {
		t.Errorf("restarts moved the nodes: got %v, want %v", got, urls)
	}
	s, err := js.Stream(ctx(t), "T")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != uint64(acked) {
		t.Errorf("stream holds %d messages, want the %d acknowledged", got, acked)
	}
}

func TestNATSClusterNeedsThreeNodes(t *testing.T) {
	if _, err := servers.StartNATSCluster(t.TempDir(), 2); err == nil {
		t.Fatal("StartNATSCluster with 2 nodes: got no error, want one")
	}
}
