package servers_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/servers"
)

func startSentinel(t *testing.T, opts servers.SentinelOptions) *servers.RedisSentinel {
	t.Helper()
	s, err := servers.StartRedisSentinel(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// TestRedisSentinelStarts proves the set is ready when StartRedisSentinel returns: three
// sentinels on distinct addresses agree on the master, which is the first data node and takes
// writes, and the replica has the writes.
func TestRedisSentinelStarts(t *testing.T) {
	t.Parallel()
	s := startSentinel(t, servers.SentinelOptions{})

	if got := len(s.SentinelAddrs()); got != 3 {
		t.Fatalf("SentinelAddrs: got %d, want 3", got)
	}
	if got := len(slices.Compact(slices.Sorted(slices.Values(s.SentinelAddrs())))); got != 3 {
		t.Errorf("SentinelAddrs %v: got %d distinct, want 3", s.SentinelAddrs(), got)
	}
	if s.MasterSet() != "sigwatch" {
		t.Errorf("MasterSet: got %q, want the default %q", s.MasterSet(), "sigwatch")
	}
	master, err := s.Master()
	if err != nil {
		t.Fatal(err)
	}
	if master != s.Nodes[0].Addr {
		t.Errorf("Master: got %s, want the first node %s", master, s.Nodes[0].Addr)
	}

	c := redisClient(t, "", master)
	if err := c.Do(ctx(t), c.B().Set().Key("k").Value("v").Build()).Error(); err != nil {
		t.Fatalf("SET on the master: %v", err)
	}
	if err := c.Do(ctx(t), c.B().Wait().Numreplicas(1).Timeout(5000).Build()).Error(); err != nil {
		t.Fatalf("WAIT 1: %v", err)
	}
	r := redisClient(t, "", s.Nodes[1].Addr)
	got, err := r.Do(ctx(t), r.B().Get().Key("k").Build()).ToString()
	if err != nil || got != "v" {
		t.Fatalf("GET k on the replica: got %q, %v, want %q", got, err, "v")
	}
}

// TestRedisSentinelFailover proves KillMaster and WaitFailover: after the master is killed
// (SIGKILL), the sentinels promote the replica, it takes writes, and it kept what was
// replicated before the kill. A client dialled through the sentinels follows.
func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	s := startSentinel(t, servers.SentinelOptions{MasterSet: "fleet"})

	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: s.SentinelAddrs(), DisableCache: true,
		Sentinel: rueidis.SentinelOption{MasterSet: s.MasterSet()},
	})
	if err != nil {
		t.Fatalf("client through the sentinels: %v", err)
	}
	t.Cleanup(c.Close)
	if err := c.Do(ctx(t), c.B().Set().Key("before").Value("1").Build()).Error(); err != nil {
		t.Fatalf("SET before: %v", err)
	}
	if n, err := c.Do(ctx(t), c.B().Wait().Numreplicas(1).Timeout(5000).Build()).AsInt64(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: got %d, %v, want 1", n, err)
	}

	killed, err := s.KillMaster()
	if err != nil {
		t.Fatal(err)
	}
	if killed != s.Nodes[0].Addr {
		t.Errorf("KillMaster: killed %s, want the first node %s", killed, s.Nodes[0].Addr)
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	promoted, err := s.WaitFailover(wctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover: the sentinels named %s after %v", promoted, time.Since(start).Round(time.Millisecond))
	if promoted != s.Nodes[1].Addr {
		t.Errorf("WaitFailover: got %s, want the replica %s", promoted, s.Nodes[1].Addr)
	}
	if m, err := s.Master(); err != nil || m != promoted {
		t.Errorf("Master after WaitFailover: got %s, %v, want %s", m, err, promoted)
	}

	p := redisClient(t, "", promoted)
	if got, err := p.Do(ctx(t), p.B().Get().Key("before").Build()).ToString(); err != nil || got != "1" {
		t.Errorf("GET before on the promoted replica: got %q, %v, want %q", got, err, "1")
	}
	// The sentinel client may see +switch-master a moment after WaitFailover's majority.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Do(ctx(t), c.B().Set().Key("after").Value("2").Build()).Error()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SET through the sentinels 10s after WaitFailover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, err := p.Do(ctx(t), p.B().Get().Key("after").Build()).ToString(); err != nil || got != "2" {
		t.Errorf("GET after on the promoted replica: got %q, %v, want %q", got, err, "2")
	}

	// A second kill leaves no replica to promote: KillMaster still works, and WaitFailover
	// gives up with the context rather than hanging.
	if _, err := s.KillMaster(); err != nil {
		t.Fatalf("second KillMaster: %v", err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	if m, err := s.WaitFailover(short); err == nil {
		t.Errorf("WaitFailover with no replica left: got %s, nil, want an error", m)
	}
}

// TestSentinelRestart proves a killed sentinel comes back on its address, still watching the
// master it knew.
func TestSentinelRestart(t *testing.T) {
	t.Parallel()
	s := startSentinel(t, servers.SentinelOptions{})
	sn := s.Sentinels[2]
	addr := sn.Addr
	if err := sn.Kill(); err != nil {
		t.Fatal(err)
	}
	restartInPlace(t, sn, &sn.Addr)
	c := redisClient(t, "", addr)
	got, err := c.Do(ctx(t), c.B().SentinelGetMasterAddrByName().Master(s.MasterSet()).Build()).AsStrSlice()
	if err != nil {
		t.Fatalf("SENTINEL GET-MASTER-ADDR-BY-NAME on the restarted sentinel: %v", err)
	}
	if m := strings.Join(got, ":"); m != s.Nodes[0].Addr {
		t.Errorf("restarted sentinel names master %s, want %s", m, s.Nodes[0].Addr)
	}
}
