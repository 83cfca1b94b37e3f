package guard

import (
	"context"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// firedMargin is how far before the earliest due deadline the timer events
// are read: the servers' clocks and the fire's lag stay well inside it.
const firedMargin = time.Minute

// restoreTimers makes the generic timers of the durable queues in Redis
// what their journal keeps, before any shard is claimable again: each
// timer at its last journalled deadline with its last payload, unless the
// event stream says it fired at that deadline; nothing the journal does
// not keep (cancelled, fired, never written), so a rollback brings back
// no timer that was cancelled or fired. A timer whose deadline passed
// fires once the shards are claimable.
func (g *Guard) restoreTimers(ctx context.Context, un *shard.Store, t shard.Topology, keep func() error) error {
	if g.o.Timers == nil {
		return nil
	}
	durable := g.o.TimerDurable
	if durable == nil {
		durable = func(string) bool { return true }
	}
	now := g.o.Now()
	live := make(map[string]dispatch.TimerState)
	var firstDue int64
	err := g.o.Timers.Each(ctx, func(st dispatch.TimerState) error {
		m := shard.TimerMember(st.Queue, st.ID)
		if st.Deadline == 0 || !durable(st.Queue) {
			delete(live, m)
			return nil
		}
		live[m] = st
		if st.Deadline <= now.UnixMilli()+firedMargin.Milliseconds() && (firstDue == 0 || st.Deadline < firstDue) {
			firstDue = st.Deadline
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("guard: read the timer journal: %w", err)
	}
	fired := 0
	if firstDue != 0 {
		err = g.o.Pub.TimersFired(ctx, time.UnixMilli(firstDue).Add(-firedMargin), func(ev dispatch.Timer) error {
			m := shard.TimerMember(ev.Queue, ev.Timer)
			if st, ok := live[m]; ok && firedAt(st, ev) {
				delete(live, m)
				fired++
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("guard: read the timer events: %w", err)
		}
	}
	dropped, err := dropStaleTimers(ctx, un, t, live, durable)
	if err != nil {
		return err
	}
	rs := make([]shard.TimerReset, 0, min(len(live), restoreBatch))
	flush := func() error {
		err := un.Timers().Restore(ctx, t, rs)
		if err == nil {
			err = keep()
		}
		rs = rs[:0]
		return err
	}
	for m, st := range live {
		rs = append(rs, shard.TimerReset{Member: m, Deadline: st.Deadline, Set: true, Payload: st.Payload, ClearPayload: st.Payload == nil})
		if len(rs) == restoreBatch {
			if err := flush(); err != nil {
				return fmt.Errorf("guard: restore timers: %w", err)
			}
		}
	}
	if err := flush(); err != nil {
		return fmt.Errorf("guard: restore timers: %w", err)
	}
	g.m.restoredTimers.Set(float64(len(live)))
	g.o.Log.Warn("timers restored from their journal", "timers", len(live), "fired_before", fired, "removed", dropped)
	return nil
}

// firedAt reports whether ev is the fire of the journalled state st: at
// its deadline, or at a later one while st was stored before that fire.
func firedAt(st dispatch.TimerState, ev dispatch.Timer) bool {
	return ev.Deadline == st.Deadline || ev.Deadline > st.Deadline && st.Stored <= ev.FiredAt
}

// dropStaleTimers removes from every shard the timers of durable queues
// that live does not keep there, and returns how many it removed.
func dropStaleTimers(ctx context.Context, un *shard.Store, t shard.Topology, live map[string]dispatch.TimerState, durable func(string) bool) (int, error) {
	n := 0
	for i := range t.Shards {
		var drop []string
		err := un.Timers().Members(ctx, i, func(m string) bool {
			q, _, ok := shard.SplitTimerMember(m)
			if !ok || !durable(q) {
				return true
			}
			if _, ok := live[m]; !ok || shard.Of(m, t.Shards) != i {
				drop = append(drop, m)
			}
			return true
		})
		if err == nil {
			err = un.Timers().Drop(ctx, i, drop)
		}
		if err != nil {
			return n, fmt.Errorf("guard: restore timers: %w", err)
		}
		n += len(drop)
	}
	return n, nil
}
