package shard

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// Deadline is where a device stands in the deadline ZSETs.
type Deadline struct {
	At      int64 // unix ms; 0 when not watched
	Shard   int   // the shard holding At (the device's shard when not watched)
	Watched bool
}

// deadlineCmds reads id's score in each shard of t that may hold it, in
// the order of t.Locate(id).
func (s *Store) deadlineCmds(t Topology, id string) rueidis.Commands {
	var cmds rueidis.Commands
	for _, i := range t.Locate(id) {
		cmds = append(cmds, s.c.B().Zscore().Key(s.k.Timers(Deadlines, i)).Member(id).Build())
	}
	return cmds
}

// deadlineOf is the rule of a device's deadline: the latest of its scores over
// the shards that may hold it (its shard and, while a doubling drains, its
// shard before), read by deadlineCmds into rs.
func deadlineOf(shards []int, rs []rueidis.RedisResult) (Deadline, error) {
	d := Deadline{Shard: shards[0]}
	for j, r := range rs {
		sc, err := r.AsFloat64()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return d, fmt.Errorf("shard: score in shard %d: %w", shards[j], err)
		}
		if int64(sc) > d.At {
			d.At, d.Shard, d.Watched = int64(sc), shards[j], true
		}
	}
	return d, nil
}

// Deadline reads id's deadline under t, in one round trip.
func (s *Store) Deadline(ctx context.Context, t Topology, id string) (Deadline, error) {
	return deadlineOf(t.Locate(id), s.c.DoMulti(ctx, s.deadlineCmds(t, id)...))
}

// lostCounts is the rule of a lost mark: a mark made at markDeadline counts
// only while the device is not watched at a later deadline. A scanner that
// marked and then died before publishing leaves a mark behind on a device
// that signalled since.
func lostCounts(markDeadline int64, d Deadline) bool { return !d.Watched || d.At <= markDeadline }
