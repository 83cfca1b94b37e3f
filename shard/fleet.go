package shard

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// Fleet counts the watched devices (members of the deadline ZSETs of the n
// shards) and the lost ones (lost marks of every registry partition) in
// one round trip: ZCARD and HLEN are O(1) each, whatever the fleet's size.
// During a doubling n is the new count, which takes in the old shards; a
// moved device counts twice while a stale copy of it waits in its old
// shard, so watched may then exceed the truth by up to the moved devices
// the drain reports.
func (s *Store) Fleet(ctx context.Context, n int) (watched, lost int64, err error) {
	if err := ValidCount(n); err != nil {
		return 0, 0, fmt.Errorf("shard: count fleet: %w", err)
	}
	b := s.c.B()
	cmds := make(rueidis.Commands, 0, n+registryParts)
	for i := range n {
		cmds = append(cmds, b.Zcard().Key(s.k.Timers(Deadlines, i)).Build())
	}
	for p := range registryParts {
		cmds = append(cmds, b.Hlen().Key(s.k.partKeyAt(p, "lost")).Build())
	}
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		c, err := r.AsInt64()
		if err != nil {
			return 0, 0, fmt.Errorf("shard: count fleet: %w", err)
		}
		if j < n {
			watched += c
		} else {
			lost += c
		}
	}
	return watched, lost, nil
}
