package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// DefaultCheckpoint is how often the lost marks are copied into the
// registry.
const DefaultCheckpoint = 5 * time.Minute

// checkpoint copies the lost marks Redis holds into the registry, where
// they differ, unless another process did within the interval. Losses
// are not written to the registry as they happen (a burst of them would
// double the cost of firing); their events are in the stream, which a
// restore reads over this copy.
func (g *Guard) checkpoint(ctx context.Context) error {
	if g.o.Registry == nil {
		return nil
	}
	if ok, err := g.o.Store.TakeLock(ctx, shard.CheckpointLock, newID(), g.o.Checkpoint); err != nil || !ok {
		return err
	}
	// Only marks read from whole data are copied: Redis answered as the
	// generation in force before and after the read.
	if err := g.whole(ctx); err != nil {
		return err
	}
	marks := map[string][2]int64{}
	err := g.o.Store.LostMarks().All(ctx, func(id string, dl, at int64) { marks[id] = [2]int64{dl, at} })
	if err != nil {
		return err
	}
	if err := g.whole(ctx); err != nil {
		return err
	}
	var ids []string
	err = g.o.Registry.Each(ctx, func(r dispatch.DeviceRecord) error {
		if m := marks[r.ID]; r.LostDeadline != m[0] {
			ids = append(ids, r.ID)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for j, err := range g.o.Registry.Update(ctx, ids, func(r *dispatch.DeviceRecord, exists bool) (bool, bool) {
		m := marks[r.ID]
		if !exists || r.LostDeadline == m[0] {
			return false, false
		}
		r.LostDeadline, r.LostAt = m[0], m[1]
		return true, false
	}) {
		if err != nil {
			return fmt.Errorf("record %s: %w", ids[j], err)
		}
	}
	g.m.checkpoints.Inc()
	return nil
}

// whole says whether Redis holds the data of the generation in force, as
// far as can be seen: the process is ready, the generation record is
// there and has not gone back, and every shard is vetted.
func (g *Guard) whole(ctx context.Context) error {
	if ok, why := g.Ready(); !ok {
		return errors.New(why)
	}
	if why := g.check(ctx); why != "" {
		g.report(why, true)
		return errors.New(why)
	}
	return g.o.Store.Vetted(ctx, g.o.Topo.Current().Shards)
}
