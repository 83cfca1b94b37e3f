package shard_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/shard"
)

func TestRedisConfigValidateSentinel(t *testing.T) {
	t.Parallel()
	sentinels := []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"}
	for _, tc := range []struct {
		name string
		cfg  shard.RedisConfig
		want []string // substrings of the error; none: valid
	}{
		{"sentinels", shard.RedisConfig{Addrs: sentinels, Sentinel: shard.SentinelConfig{MasterSet: "mymaster"}}, nil},
		{"one sentinel", shard.RedisConfig{Addrs: sentinels[:1], Sentinel: shard.SentinelConfig{MasterSet: "mymaster", Username: "u", Password: "p"}}, nil},
		{"no sentinels", shard.RedisConfig{Sentinel: shard.SentinelConfig{MasterSet: "mymaster"}},
			[]string{"redis.addrs is empty", "with redis.sentinel.master_set, list the sentinels"}},
		{"blank master set", shard.RedisConfig{Addrs: sentinels, Sentinel: shard.SentinelConfig{MasterSet: "my master"}},
			[]string{`redis.sentinel.master_set "my master" must not contain spaces`}},
		{"sentinel password without master set", shard.RedisConfig{Addrs: sentinels, Sentinel: shard.SentinelConfig{Password: "p"}},
			[]string{"redis.sentinel.password is set but redis.sentinel.master_set is not"}},
		{"sentinel username without master set", shard.RedisConfig{Addrs: sentinels, Sentinel: shard.SentinelConfig{Username: "u"}},
			[]string{"redis.sentinel.username is set but redis.sentinel.master_set is not"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: got %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate: got nil, want an error with %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate: got %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

// startSentinel starts a Redis master, its replica and three sentinels for t.
func startSentinel(t *testing.T, opts servers.SentinelOptions) *servers.RedisSentinel {
	t.Helper()
	rs, err := servers.StartRedisSentinel(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	return rs
}

func dialSentinel(t *testing.T, cfg shard.RedisConfig) *shard.Store {
	t.Helper()
	s, err := shard.Dial(cfg)
	if err != nil {
		t.Fatalf("Dial through the sentinels: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestStoreFollowsSentinelFailover proves that a Store dialled through the sentinels survives a
// crash of the master (kill -9) under a stream of deadline writes: within a bound after the kill
// its writes land on the promoted replica and its reads see them, and what was replicated before
// the kill is still there. (Writes acknowledged but not yet replicated may be lost: detecting
// that is docs/guarantees.md, guarantee 11, not this test.)
func TestStoreFollowsSentinelFailover(t *testing.T) {
	t.Parallel()
	storeFollowsFailover(t, "")
}

// TestStoreFollowsSentinelFailoverWithoutItsSentinel is TestStoreFollowsSentinelFailover when
// the sentinel the Store listens to for +switch-master dies with the master, as when both run
// on one host: the Store turns to the other sentinels.
func TestStoreFollowsSentinelFailoverWithoutItsSentinel(t *testing.T) {
	t.Parallel()
	storeFollowsFailover(t, "kill")
}

// TestStoreFollowsSentinelFailoverPastAFrozenSentinel is TestStoreFollowsSentinelFailover when
// the sentinel the Store listens to is frozen (SIGSTOP) before the master dies: its connection
// stays open and no +switch-master ever comes on it, so only asking the other sentinels finds
// the new master.
func TestStoreFollowsSentinelFailoverPastAFrozenSentinel(t *testing.T) {
	t.Parallel()
	storeFollowsFailover(t, "pause")
}

// storeFollowsFailover runs the failover under a stream of writes; itsSentinel is what happens
// to the sentinel the Store listens to just before the master is killed: "" nothing, "kill" or
// "pause".
func storeFollowsFailover(t *testing.T, itsSentinel string) {
	rs := startSentinel(t, servers.SentinelOptions{})
	s := dialSentinel(t, shard.RedisConfig{
		Addrs: rs.SentinelAddrs(), Prefix: "sw",
		Sentinel: shard.SentinelConfig{MasterSet: rs.MasterSet()},
	})
	ctx := t.Context()

	// Deadlines written and replicated (WAIT) before the crash must survive it.
	before := map[int][]shard.Entry{}
	for i := range 4 {
		for j := range 25 {
			before[i] = append(before[i], shard.Entry{ID: devID(i, j), Deadline: int64(1_000_000 + j)})
		}
	}
	if _, err := s.Upsert(ctx, shard.Deadlines, before); err != nil {
		t.Fatalf("Upsert before the failover: %v", err)
	}
	m := rawClient(t, mustMaster(t, rs))
	if n, err := m.Do(ctx, m.B().Wait().Numreplicas(1).Timeout(5000).Build()).AsInt64(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 on the master: got %d, %v, want 1", n, err)
	}
	m.Close()

	// A stream of writes, as ingest makes, runs across the crash. Each write is one attempt
	// with a short timeout, so that the time the Store is unusable is measured, not hidden in
	// a long retry.
	var seq int64
	write := func() (shard.Entry, error) {
		seq++
		e := shard.Entry{ID: "stream", Deadline: 2_000_000 + seq}
		c, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err := s.Upsert(c, shard.Deadlines, map[int][]shard.Entry{0: {e}})
		return e, err
	}
	for range 50 {
		if _, err := write(); err != nil {
			t.Fatalf("write before the failover: %v", err)
		}
	}

	if itsSentinel != "" {
		// The client starts with the first sentinel it is given and subscribes there.
		sn := rs.Sentinels[0]
		if n := subscribers(t, sn.Addr); n != 1 {
			t.Fatalf("sentinel %s has %d subscribed clients, want the Store's 1", sn.Addr, n)
		}
		stop := sn.Kill
		if itsSentinel == "pause" {
			stop = sn.Pause
			t.Cleanup(func() { sn.Resume() })
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	killed, err := rs.KillMaster()
	if err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	bound := 20 * time.Second
	if itsSentinel == "pause" {
		// A frozen sentinel is noticed only when a PING on its connection goes unanswered
		// for rueidis' ConnWriteTimeout (10s by default).
		bound = 30 * time.Second
	}
	var failed int
	var last error
	for {
		e, err := write()
		if err == nil {
			// The write went to a master; reading it back proves it is the one reads see.
			got, ok, rerr := s.Score(ctx, shard.Deadlines, 0, e.ID)
			if rerr == nil && ok && got == e.Deadline {
				break
			}
			err = rerr
			if err == nil {
				t.Fatalf("read after write %v: got %d (present %v), want %d", e, got, ok, e.Deadline)
			}
		}
		failed++
		last = err
		if time.Since(killedAt) > bound {
			t.Fatalf("Store still failing %v after kill -9 of master %s: %d failed attempts, last: %v", bound, killed, failed, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(killedAt)
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	promoted, err := rs.WaitFailover(wctx)
	if err != nil {
		t.Fatalf("the Store writes again, but: %v", err)
	}
	t.Logf("Store wrote and read again %v after kill -9 of master %s (now %s), after %d failed attempts (last: %v)",
		took.Round(time.Millisecond), killed, promoted, failed, last)

	for i, es := range before {
		for _, e := range es {
			got, ok, err := s.Score(ctx, shard.Deadlines, i, e.ID)
			if err != nil || !ok || got != e.Deadline {
				t.Fatalf("replicated deadline %s in shard %d after the failover: got %d (present %v), %v, want %d", e.ID, i, got, ok, err, e.Deadline)
			}
		}
	}
	// The store's clock and scripts work on the promoted replica too.
	if _, err := s.Time(ctx); err != nil {
		t.Errorf("Time after the failover: %v", err)
	}
	for range 50 {
		if _, err := write(); err != nil {
			t.Fatalf("write after the failover: %v", err)
		}
	}
	if got, _, err := s.Score(ctx, shard.Deadlines, 0, "stream"); err != nil || got != 2_000_000+seq {
		t.Errorf("last streamed deadline: got %d, %v, want %d", got, err, 2_000_000+seq)
	}
}

// subscribers counts the clients of the sentinel at addr that are subscribed to something.
func subscribers(t *testing.T, addr string) int {
	t.Helper()
	c := rawClient(t, addr)
	defer c.Close()
	list, err := c.Do(t.Context(), c.B().ClientList().Build()).ToString()
	if err != nil {
		t.Fatalf("CLIENT LIST on sentinel %s: %v", addr, err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " sub=") && !strings.Contains(line, " sub=0 ") {
			n++
		}
	}
	return n
}

func devID(i, j int) string { return "dev-" + string(rune('a'+i)) + "-" + string(rune('a'+j)) }

func mustMaster(t *testing.T, rs *servers.RedisSentinel) string {
	t.Helper()
	addr, err := rs.Master()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// rawClient is a client straight to one Redis, for what a Store does not do (WAIT).
func rawClient(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatalf("client to %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestDialSentinelHints proves that Dial's errors say what to fix when sentinels and Redis are
// mixed up or the master set is wrong.
func TestDialSentinelHints(t *testing.T) {
	t.Parallel()
	rs := startSentinel(t, servers.SentinelOptions{MasterSet: "fleet"})
	free, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	down := fmt.Sprintf("127.0.0.1:%d", free)
	for _, tc := range []struct {
		name string
		cfg  shard.RedisConfig
		want string
	}{
		{"wrong master set", shard.RedisConfig{Addrs: rs.SentinelAddrs(), Sentinel: shard.SentinelConfig{MasterSet: "nosuch"}},
			`the sentinels monitor no master set "nosuch"`},
		{"redis, not sentinels", shard.RedisConfig{Addrs: []string{rs.Nodes[0].Addr}, Sentinel: shard.SentinelConfig{MasterSet: "fleet"}},
			"redis.addrs must list the sentinels, not Redis itself"},
		{"sentinels down", shard.RedisConfig{Addrs: []string{down}, Sentinel: shard.SentinelConfig{MasterSet: "fleet"}},
			"are the sentinels, and the master they name, running?"},
		{"sentinels without master set", shard.RedisConfig{Addrs: rs.SentinelAddrs()},
			"if redis.addrs are sentinels, set redis.sentinel.master_set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := shard.Dial(tc.cfg)
			if err == nil {
				s.Close()
				t.Fatalf("Dial: got nil error, want one with %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Dial: got %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestDialSentinelWithPasswords proves that redis.sentinel.password goes to the sentinels and
// redis.password to the master: each is needed, and neither stands in for the other.
func TestDialSentinelWithPasswords(t *testing.T) {
	t.Parallel()
	rs := startSentinel(t, servers.SentinelOptions{Password: "data-secret", SentinelPassword: "watch-secret"})
	cfg := shard.RedisConfig{
		Addrs: rs.SentinelAddrs(), Password: "data-secret", Prefix: "sw",
		Sentinel: shard.SentinelConfig{MasterSet: rs.MasterSet(), Password: "watch-secret"},
	}
	s := dialSentinel(t, cfg)
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if _, err := s.Upsert(t.Context(), shard.Deadlines, map[int][]shard.Entry{0: {{ID: "d", Deadline: 1}}}); err != nil {
		t.Fatalf("Upsert: %v", err)
	}

	noSentinelPass := cfg
	noSentinelPass.Sentinel.Password = ""
	if s, err := shard.Dial(noSentinelPass); err == nil {
		s.Close()
		t.Error("Dial without redis.sentinel.password: got nil error")
	}
	noMasterPass := cfg
	noMasterPass.Password = ""
	if s, err := shard.Dial(noMasterPass); err == nil {
		s.Close()
		t.Error("Dial without redis.password: got nil error")
	}
}
