package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// A Redis restart stamps no shard with its new process, so every shard it
// serves is refused until vetted again. When the process that went away
// acknowledged nothing it had not fsynced to its append-only file, and the
// one now serving the shard is its restart (same address, a master loading
// that file), the restart lost nothing acknowledged: the guard stamps the
// shards again under the same generation, without a restore. The guard
// learns how each Redis process persists while it serves, since the one
// that matters is gone by the time its restart is seen. Anything it cannot
// prove is handled as a loss.

// runsEvery is how often the guard asks Redis how its processes persist.
const runsEvery = time.Second

// runsForget is how long a Redis process no longer seen is remembered.
const runsForget = time.Hour

// errAsk is restartedWhole's answer when Redis did not answer.
const errAsk = "Redis did not answer"

// seenRun is a Redis process as last seen serving, and when.
type seenRun struct {
	shard.Run
	at time.Time
}

// runs is what the guard knows of the Redis processes it has seen.
type runs struct {
	byID   map[string]seenRun
	byAddr map[string]string // the run id last seen at each address
	polled time.Time
}

// pollRuns records how every Redis process persists, at most every
// runsEvery, and reports a process that changed under an address: the
// restart is then judged before a claim is refused for it.
func (g *Guard) pollRuns(ctx context.Context) {
	now := g.o.Now()
	if now.Sub(g.runs.polled) < runsEvery {
		return
	}
	g.runs.polled = now
	rs, err := g.o.Store.Runs(ctx)
	if err != nil {
		return // Redis not answering is an outage, not a restart
	}
	changed := g.noteRuns(rs, now)
	if len(changed) > 0 {
		g.report("Redis restarted or failed over at "+strings.Join(changed, ", "), false)
	}
}

// noteRuns records runs seen at now and returns the addresses whose
// process or role changed since the last poll.
func (g *Guard) noteRuns(rs []shard.Run, now time.Time) []string {
	if g.runs.byID == nil {
		g.runs.byID, g.runs.byAddr = map[string]seenRun{}, map[string]string{}
	}
	first := len(g.runs.byAddr) == 0
	var changed []string
	for _, r := range rs {
		was, ok := g.runs.byAddr[r.Addr]
		// Another process at an address, a new address, or a replica
		// promoted: a shard may be served by another process than the one
		// that stamped it.
		if ok && was != r.ID || !ok && !first || r.Master && !g.runs.byID[r.ID].Master && ok {
			changed = append(changed, r.Addr)
		}
		g.runs.byAddr[r.Addr] = r.ID
		g.runs.byID[r.ID] = seenRun{r, now}
	}
	for id, r := range g.runs.byID {
		if now.Sub(r.at) > runsForget {
			delete(g.runs.byID, id)
		}
	}
	return changed
}

// restartedWhole proves, for every shard served by another Redis process
// than the one that stamped it, that the process is a restart which kept
// everything acknowledged, and stamps those shards again. It returns why
// not when it cannot, or errAsk when Redis did not answer (still starting,
// or down again): the restart is then judged at the next check.
func (g *Guard) restartedWhole(ctx context.Context) (bool, string) {
	rs, err := g.o.Store.Runs(ctx)
	if err != nil {
		return false, errAsk
	}
	serving := map[string]shard.Run{}
	for _, r := range rs {
		serving[r.ID] = r
	}
	type restarts struct {
		s  *shard.Store
		rs []shard.Restarted
	}
	var all []restarts
	stores := []*shard.Store{g.o.Store}
	shards := []int{g.o.Topo.Current().Shards}
	if g.o.Alarm != nil && g.o.AlarmTopo != nil {
		stores, shards = append(stores, g.o.Alarm), append(shards, g.o.AlarmTopo.Current().Shards)
	}
	addrs := map[string]bool{}
	for i, s := range stores {
		got, err := s.Restarts(ctx, shards[i])
		if err != nil && !errors.Is(err, shard.ErrDataLoss) {
			return false, errAsk
		}
		if err != nil {
			return false, err.Error()
		}
		for _, r := range got {
			if why := g.kept(r, serving); why != "" {
				return false, why
			}
			addrs[serving[r.Now].Addr] = true
		}
		all = append(all, restarts{s, got})
	}
	n := 0
	for _, r := range all {
		if err := r.s.Restamp(ctx, r.rs); err != nil {
			// Another process may have proven the same restart first.
			if !errors.Is(err, shard.ErrDataLoss) || g.stillLost(ctx) {
				return false, err.Error()
			}
		}
		n += len(r.rs)
	}
	if n == 0 {
		return false, "no shard was restarted, yet one is not vetted"
	}
	g.noteRuns(rs, g.o.Now())
	g.m.cleanRestarts.Inc()
	at := make([]string, 0, len(addrs))
	for a := range addrs {
		at = append(at, a)
	}
	g.o.Log.Info("Redis restarted with everything it acknowledged in its append-only file; working on without a restore",
		"redis", strings.Join(at, ","), "shards", n, "generation", g.o.Store.Generation())
	return true, ""
}

// kept says why the process serving r may have lost what the one that
// stamped it acknowledged ("" when it cannot have).
func (g *Guard) kept(r shard.Restarted, serving map[string]shard.Run) string {
	was, ok := g.runs.byID[r.Was]
	now, serves := serving[r.Now]
	switch {
	case !ok:
		return fmt.Sprintf("shard %d was served by a Redis process this one did not see, so how it persisted is unknown", r.Shard)
	case !was.Durable:
		return fmt.Sprintf("the Redis at %s did not write every write to its append-only file before acknowledging it (appendonly yes, appendfsync always)", was.Addr)
	case !serves || now.Addr != was.Addr:
		return fmt.Sprintf("shard %d moved from the Redis at %s to another: a failover", r.Shard, was.Addr)
	case !now.Master || now.Replicated || !now.AOF:
		return fmt.Sprintf("the Redis at %s came back as a replica, promoted from one, or without its append-only file", now.Addr)
	}
	return ""
}
