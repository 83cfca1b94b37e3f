package shard_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// writeRound is one round of the writer in TestStoreFollowsClusterFailover: one UpsertAt over
// the shards of the killed master, one over the others.
type writeRound struct {
	start, end         time.Time
	round              int64
	victimErr, restErr error
}

// TestStoreFollowsClusterFailover: on a Redis Cluster of 3 masters with one replica each, a
// master is killed with -9 while one Store keeps writing deadlines into every shard. Once the
// killed master's replica serves its slots, the same Store, not dialled again, writes, claims
// under the leases it took before the kill, and reads every shard: the client follows the
// promotion by itself, and nothing it had acknowledged and Redis had replicated is lost
// (the leases, the deadlines).
func TestStoreFollowsClusterFailover(t *testing.T) {
	cluster := testenv.RedisClusterWith(t, servers.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second})
	s := testenv.StoreOn(t, cluster.Addrs, "sw")
	ctx := context.Background()
	const n = 16
	topo, err := s.InitTopology(ctx, n)
	if err != nil {
		t.Fatal(err)
	}

	// One device in every shard; the shards of shard 0's master are the victim's.
	ids := make([]string, n)
	for k, filled := 0, 0; filled < n; k++ {
		id := fmt.Sprintf("dev-%d", k)
		if i := shard.Of(id, n); ids[i] == "" {
			ids[i], filled = id, filled+1
		}
	}
	keys := shard.NewKeys("sw")
	victim, err := cluster.MasterOf(keys.Timers(shard.Deadlines, 0))
	if err != nil {
		t.Fatal(err)
	}
	heirs, err := cluster.ReplicasOf(victim)
	if err != nil || len(heirs) != 1 {
		t.Fatalf("replicas of the victim: got %d, %v, want 1", len(heirs), err)
	}
	var onVictim, rest []int
	for i := range n {
		m, err := cluster.MasterOf(keys.Timers(shard.Deadlines, i))
		if err != nil {
			t.Fatal(err)
		}
		if m == victim {
			onVictim = append(onVictim, i)
		} else {
			rest = append(rest, i)
		}
	}

	leases := make([]shard.Lease, n)
	for i := range n {
		l, ok, err := s.Acquire(ctx, i, "scanner-a", time.Minute)
		if err != nil || !ok {
			t.Fatalf("acquire shard %d: got %v, %v, want a lease", i, ok, err)
		}
		leases[i] = l
	}
	base := time.Now().Add(time.Hour).UnixMilli()
	write := func(ctx context.Context, shards []int, round int64) error {
		byShard := make(map[int][]shard.Entry, len(shards))
		for _, i := range shards {
			byShard[i] = []shard.Entry{{ID: ids[i], Deadline: base + round}}
		}
		_, refused, err := s.UpsertAt(ctx, shard.Deadlines, topo.Epoch, byShard, nil)
		if err == nil && len(refused) > 0 {
			err = fmt.Errorf("shards %v refused", refused)
		}
		return err
	}
	if err := write(ctx, append(slices.Clone(onVictim), rest...), 0); err != nil {
		t.Fatal(err)
	}
	// The leases and first deadlines are on the replicas before the kill: what is under test
	// is the client, not asynchronous replication's last milliseconds.
	if err := cluster.WaitReplicated(ctx); err != nil {
		t.Fatal(err)
	}

	// The writer goes on until stopped, a round every few milliseconds, each round bounded so
	// that a dead connection cannot hold it.
	var (
		mu     sync.Mutex
		rounds []writeRound
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for round := int64(1); ; round++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			w := writeRound{start: time.Now(), round: round}
			w.victimErr = write(rctx, onVictim, round)
			w.restErr = write(rctx, rest, round)
			w.end = time.Now()
			cancel()
			mu.Lock()
			rounds = append(rounds, w)
			mu.Unlock()
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}()
	okSince := func(since time.Time) (writeRound, bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range rounds {
			if w.start.After(since) && w.victimErr == nil && w.restErr == nil {
				return w, true
			}
		}
		return writeRound{}, false
	}
	testenv.WaitFor(t, 5*time.Second, "the writer's first rounds", func() bool {
		_, ok := okSince(time.Time{})
		return ok
	})

	killed := time.Now()
	if err := cluster.Kill(victim); err != nil {
		t.Fatal(err)
	}
	healthy := make(chan time.Time, 1)
	go func() {
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := cluster.WaitHealthy(hctx); err != nil {
			t.Error(err)
		}
		healthy <- time.Now()
	}()
	var first writeRound
	testenv.WaitFor(t, 30*time.Second, "a round written to every shard after the kill", func() bool {
		var ok bool
		first, ok = okSince(killed)
		return ok
	})
	healed := <-healthy
	// rueidis refreshes its slot map at most 1s after an error; a few seconds leave room for
	// a loaded machine without hiding a client that never follows.
	const bound = 5 * time.Second
	if lag := first.end.Sub(healed); lag > bound {
		t.Errorf("the Store wrote every shard again %v after the cluster healed, want within %v", lag, bound)
	}
	close(stop)
	<-done

	mu.Lock()
	var failedVictim, failedRest int
	var restFrom, restTo time.Time // the first and last failed round on the other masters' shards
	errs := map[string]bool{}
	last := rounds[len(rounds)-1]
	var lastOK writeRound
	for _, w := range rounds {
		if w.victimErr != nil {
			failedVictim++
			errs[errText(w.victimErr)] = true
		}
		if w.restErr != nil {
			if failedRest == 0 {
				restFrom = w.start
			}
			restTo = w.end
			failedRest++
			errs[errText(w.restErr)] = true
		}
		if w.victimErr == nil && w.restErr == nil {
			lastOK = w
		}
	}
	mu.Unlock()
	t.Logf("killed master %s at %s: cluster healthy after %v, Store wrote every shard again after %v;"+
		" %d rounds failed on the victim's %d shards, %d on the other %d (from %v to %v after the kill);"+
		" errors: %q",
		victim.Addr, killed.Format("15:04:05.000"), healed.Sub(killed).Round(time.Millisecond),
		first.end.Sub(killed).Round(time.Millisecond), failedVictim, len(onVictim), failedRest, len(rest),
		sinceOrZero(restFrom, killed), sinceOrZero(restTo, killed),
		slices.Sorted(func(yield func(string) bool) {
			for e := range errs {
				if !yield(e) {
					return
				}
			}
		}))
	if failedVictim == 0 {
		t.Fatalf("no write to the killed master's shards failed: the kill did not hit the write path")
	}
	if last != lastOK {
		t.Fatalf("the last round failed after the Store had recovered: %v / %v", last.victimErr, last.restErr)
	}

	// Claims under the leases taken before the kill, and reads, on every shard, by the same
	// Store: each shard holds its device at the last round written.
	want := base + lastOK.round
	for i := range n {
		c, err := s.Claim(ctx, shard.Deadlines, i, leases[i], want, 10, time.Now())
		if err != nil {
			t.Fatalf("claim shard %d after failover: %v", i, err)
		}
		if got := c.Due; len(got) != 1 || got[0] != (shard.Entry{ID: ids[i], Deadline: want}) {
			t.Errorf("claim shard %d: got %v, want [%s %d]", i, got, ids[i], want)
		}
		if err := s.Renew(ctx, leases[i], time.Minute); err != nil {
			t.Errorf("renew lease of shard %d after failover: %v", i, err)
		}
		score, ok, err := s.Score(ctx, shard.Deadlines, i, ids[i])
		if err != nil || !ok || score != want {
			t.Errorf("score of %s in shard %d: got %d, %v, %v, want %d", ids[i], i, score, ok, err, want)
		}
	}
}

// errText is an error without the addresses and numbers that make each instance unique.
func errText(err error) string {
	s := err.Error()
	if i := strings.Index(s, "dial tcp"); i >= 0 {
		return s[:i] + "dial tcp …"
	}
	return s
}

// sinceOrZero is t - from, or 0 for a zero t.
func sinceOrZero(t, from time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return t.Sub(from).Round(time.Millisecond)
}
