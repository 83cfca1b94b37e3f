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

// TimerMembers calls fn with every generic timer member shard i holds,
// until fn returns false.
func (s *Store) TimerMembers(ctx context.Context, i int, fn func(member string) bool) error {
	if err := s.scanMembers(ctx, s.k.Timers(Timers, i), fn); err != nil {
		return fmt.Errorf("shard: scan timers of shard %d: %w", i, err)
	}
	return nil
}

// DropTimers removes members, with their payloads and firing marks, from
// shard i.
func (s *Store) DropTimers(ctx context.Context, i int, members []string) error {
	for len(members) > 0 {
		chunk := members[:min(len(members), scanCount)]
		members = members[len(chunk):]
		cmds := []rueidis.Completed{
			s.c.B().Zrem().Key(s.k.Timers(Timers, i)).Member(chunk...).Build(),
			s.c.B().Hdel().Key(s.k.TimerPayloads(i)).Field(chunk...).Build(),
			s.c.B().Hdel().Key(s.k.TimersFiring(i)).Field(chunk...).Build(),
		}
		for _, r := range s.c.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return fmt.Errorf("shard: drop timers of shard %d: %w", i, err)
			}
		}
	}
	return nil
}

// RestoreTimers writes rs (Set resets, each with its payload or
// ClearPayload) under topology t, each in its shard there.
func (s *Store) RestoreTimers(ctx context.Context, t Topology, rs []TimerReset) error {
	by := make(map[int][]TimerReset)
	for _, r := range rs {
		i := Of(r.Member, t.Shards)
		by[i] = append(by[i], r)
	}
	refused, err := s.resetTimersAt(ctx, t, by, nil)
	if err == nil && len(refused) > 0 {
		err = fmt.Errorf("shard: restore timers: shard %d refused topology epoch %d", refused[0], t.Epoch)
	}
	return err
}
