package shard

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// A restore after Redis lost data makes the generic timers of the durable
// queues what their journal says: it lists what each shard holds, drops
// what the journal does not keep (cancelled, fired, or in another shard),
// and writes the rest exactly. It runs under the restore lock while every
// shard refuses claims and writes of the old generation, so nothing else
// writes the timers meanwhile.

// Members calls fn with every generic timer member shard i holds,
// until fn returns false.
func (q QueueTimers) Members(ctx context.Context, i int, fn func(member string) bool) error {
	if err := q.s.scanMembers(ctx, q.s.k.Timers(Timers, i), fn); err != nil {
		return fmt.Errorf("shard: scan timers of shard %d: %w", i, err)
	}
	return nil
}

// Drop removes members, with their payloads and firing marks, from
// shard i.
func (q QueueTimers) Drop(ctx context.Context, i int, members []string) error {
	for len(members) > 0 {
		chunk := members[:min(len(members), scanCount)]
		members = members[len(chunk):]
		cmds := []rueidis.Completed{
			q.s.c.B().Zrem().Key(q.s.k.Timers(Timers, i)).Member(chunk...).Build(),
			q.s.c.B().Hdel().Key(q.s.k.TimerPayloads(i)).Field(chunk...).Build(),
			q.s.c.B().Hdel().Key(q.s.k.TimersFiring(i)).Field(chunk...).Build(),
		}
		for _, r := range q.s.c.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return fmt.Errorf("shard: drop timers of shard %d: %w", i, err)
			}
		}
	}
	return nil
}

// Restore writes rs (Set resets, each with its payload or
// ClearPayload) under topology t, each in its shard there.
func (q QueueTimers) Restore(ctx context.Context, t Topology, rs []TimerReset) error {
	by := make(map[int][]TimerReset)
	for _, r := range rs {
		i := Of(r.Member, t.Shards)
		by[i] = append(by[i], r)
	}
	refused, err := q.s.resetTimersAt(ctx, t, by, nil)
	if err == nil && len(refused) > 0 {
		err = fmt.Errorf("shard: restore timers: shard %d refused topology epoch %d", refused[0], t.Epoch)
	}
	return err
}
