package guard

import (
	"context"
	"errors"
	"fmt"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// meta reads the registry's installation record.
func (g *Guard) meta(ctx context.Context) (dispatch.RegistryMeta, bool, error) {
	if g.o.Registry == nil {
		return dispatch.RegistryMeta{}, false, nil
	}
	m, ok, err := g.o.Registry.Meta(ctx)
	if err != nil {
		return m, false, fmt.Errorf("guard: read the registry's installation record: %w", err)
	}
	return m, ok, nil
}

// recordMeta writes the generation and the topologies in force into the
// registry's installation record, creating it with the installation.
func (g *Guard) recordMeta(ctx context.Context, gen string) error {
	if g.o.Registry == nil {
		return nil
	}
	t, err := g.o.Store.Topology(ctx)
	if err != nil {
		return err
	}
	var at shard.Topology
	if g.o.Alarm != nil {
		if at, err = g.o.Alarm.Topology(ctx); errors.Is(err, shard.ErrNoTopology) {
			at, err = shard.Topology{}, nil
		}
		if err != nil {
			return err
		}
	}
	now := g.o.Now().UnixMilli()
	m, err := g.o.Registry.UpdateMeta(ctx, func(m *dispatch.RegistryMeta) bool {
		if m.Installed == 0 {
			m.Installed = now
		}
		m.Generation = gen
		raiseMeta(m, t, at)
		return true
	})
	if err != nil {
		return fmt.Errorf("guard: write the registry's installation record: %w", err)
	}
	g.seenEpoch, g.seenAlarmEpoch = m.Epoch, m.AlarmEpoch
	return nil
}

// raiseMeta raises the topologies m records to t and at where they are
// higher.
func raiseMeta(m *dispatch.RegistryMeta, t, at shard.Topology) bool {
	changed := false
	if t.Epoch > m.Epoch {
		m.Shards, m.Prev, m.Epoch, changed = t.Shards, t.Prev, t.Epoch, true
	}
	if at.Epoch > m.AlarmEpoch {
		m.AlarmShards, m.AlarmPrev, m.AlarmEpoch, changed = at.Shards, at.Prev, at.Epoch, true
	}
	return changed
}

// trackTopology records a topology change (a doubling) in the registry, so
// that a loss never takes the shard count back.
func (g *Guard) trackTopology(ctx context.Context) {
	if g.o.Registry == nil || g.o.Topo == nil {
		return
	}
	t := g.o.Topo.Current()
	var at shard.Topology
	if g.o.AlarmTopo != nil {
		at = g.o.AlarmTopo.Current()
	}
	if t.Epoch <= g.seenEpoch && at.Epoch <= g.seenAlarmEpoch {
		return
	}
	m, err := g.o.Registry.UpdateMeta(ctx, func(m *dispatch.RegistryMeta) bool { return raiseMeta(m, t, at) })
	if err != nil {
		g.o.Log.Warn("topology not recorded in the registry", "err", err)
		return
	}
	g.seenEpoch, g.seenAlarmEpoch = m.Epoch, m.AlarmEpoch
}

// backfill fills the durable registry with every device Redis knows, for
// an installation from before it.
func (g *Guard) backfill(ctx context.Context, t shard.Topology) error {
	known, err := g.o.Store.KnownDevices(ctx, t)
	if err != nil {
		return fmt.Errorf("guard: upgrade: %w", err)
	}
	if g.o.Registry == nil {
		return nil
	}
	recs := make([]dispatch.DeviceRecord, 0, len(known))
	for _, k := range known {
		recs = append(recs, dispatch.DeviceRecord{ID: k.ID, Type: k.Type, Threshold: k.Threshold.Milliseconds(),
			LostDeadline: k.LostDeadline, LostAt: k.LostAt, Alarm: k.Alarm})
	}
	fill := func(r *dispatch.DeviceRecord, exists bool) (bool, bool) {
		k := known[r.ID]
		if exists || k == nil {
			return false, false
		}
		r.Type, r.Threshold, r.LostDeadline, r.LostAt, r.Alarm = k.Type, k.Threshold.Milliseconds(), k.LostDeadline, k.LostAt, k.Alarm
		return true, false
	}
	for lo := 0; lo < len(recs); lo += restoreBatch {
		for j, err := range g.o.Registry.Add(ctx, recs[lo:min(lo+restoreBatch, len(recs))], fill) {
			if err != nil {
				return fmt.Errorf("guard: upgrade: record %s in the registry: %w", recs[lo+j].ID, err)
			}
		}
	}
	g.o.Log.Info("installation from before the durable registry: every device Redis knows is recorded in it", "devices", len(recs))
	return nil
}
