package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// restoreBatch is how many registry records one round of writes carries.
const restoreBatch = 1000

// restored counts what a restore put back.
type restored struct {
	Devices, Rearmed, Lost, Recovered, Alarms int
	// Missing counts what the registry knew and Redis did not hold: a
	// device's deadline, or the mark of its loss.
	Missing int
}

// restore rebuilds Redis from the registry under the restore lock held
// with token. since is when the data was last known whole (0: unknown).
//
// Order matters: the topology first (never below one seen), then the
// thresholds set per type at run time, then every device (re-armed, or lost as before), then the outage that gives the
// re-armed a full threshold from its end, then the vetting that lets
// shards be claimed again, then the alarms (their timers are written
// under the new generation), and last the generation record, which tells
// every other process to go on.
// inFlightSettle is how long a restore waits, once every shard refuses
// claims under the old generation, for the events of claims that passed
// just before to reach the stream.
const inFlightSettle = 500 * time.Millisecond

func (g *Guard) restore(ctx context.Context, why string, since int64, token string, certain bool) error {
	start := g.o.Now()
	gen := newID()
	guessed := since <= 0 || since > start.UnixMilli()
	if guessed {
		// Nothing says when the data was last whole: any silence up to a
		// threshold back may be ours.
		since = start.Add(-g.o.Thresholds.Max()).UnixMilli()
	}
	if certain {
		g.publish(ctx, "redis_data_loss", "redis_data_loss@"+gen, map[string]any{"reason": why, "since": since})
	}
	lk := &lockKeeper{g: g, ctx: ctx, token: token}
	ctx, release := lk.during(ctx)
	defer func() { _ = release() }()
	keep := lk.keep
	meta, _, err := g.meta(ctx)
	if err != nil {
		return err
	}
	un := g.o.Store.Unchecked()
	t, err := restoreTopology(ctx, un, shard.Topology{Shards: meta.Shards, Prev: meta.Prev, Epoch: meta.Epoch}, g.o.Topo, g.o.Initial, start)
	if err != nil {
		return err
	}
	var at shard.Topology
	if g.o.Alarm != nil {
		seen := shard.Topology{Shards: meta.AlarmShards, Prev: meta.AlarmPrev, Epoch: meta.AlarmEpoch}
		if at, err = restoreTopology(ctx, g.o.Alarm.Unchecked(), seen, g.o.AlarmTopo, t.Shards, start); err != nil {
			return err
		}
	}

	// Every shard is vetted under the new generation before the stream's
	// history is read: from here on no claim under the old generation
	// succeeds anywhere. On a Redis Cluster that lost one node the shards
	// of the others are whole and would otherwise keep firing during the
	// restore, after the history it reads, and their devices be re-armed
	// as live and fire twice. Nothing claims under the new generation
	// before the outage is recorded (SetGeneration below).
	if err := un.Vet(ctx, t.Shards, gen); err != nil {
		return err
	}
	if g.o.Alarm != nil {
		if err := g.o.Alarm.Unchecked().Vet(ctx, at.Shards, gen); err != nil {
			return err
		}
	}
	// A claim that passed just before the vet publishes within moments;
	// its event is then in the history.
	select {
	case <-time.After(inFlightSettle):
	case <-ctx.Done():
		return ctx.Err()
	}

	var n restored
	var alarms [][2]string
	var lost []dispatch.DeviceRecord
	if g.o.Registry != nil {
		if err := g.restoreTypes(ctx, un); err != nil {
			return err
		}
		if guessed {
			// A type's threshold set at run time is in force again, and
			// may be the longest.
			since = min(since, start.Add(-g.o.Thresholds.Max()).UnixMilli())
		}
		// The stream's recent losses and recoveries come first: the
		// registry catches up with them in the background.
		hist, err := history(ctx, g.o.Pub, keep)
		if err != nil {
			return err
		}
		var batch []dispatch.DeviceRecord
		flush := func() error {
			err := g.restoreDevices(ctx, un, t, batch, start, &n)
			batch = batch[:0]
			if err == nil {
				err = keep()
			}
			return err
		}
		err = g.o.Registry.Each(ctx, func(r dispatch.DeviceRecord) error {
			if r.Alarm != "" {
				alarms = append(alarms, [2]string{r.ID, r.Alarm})
			}
			hist.apply(&r)
			if r.LostDeadline != 0 {
				lost = append(lost, dispatch.DeviceRecord{ID: r.ID, Group: r.Group, LostDeadline: r.LostDeadline})
			}
			if batch = append(batch, r); len(batch) == restoreBatch {
				return flush()
			}
			return nil
		})
		if err == nil {
			err = flush()
		}
		if err != nil {
			return fmt.Errorf("guard: restore devices: %w", err)
		}
	} else {
		g.o.Log.Error("Redis data loss", "err", errNoRegistry)
	}
	if err := g.restoreTimers(ctx, un, t, keep); err != nil {
		return err
	}
	// The outage covers the restore so far; it is extended to the end
	// below. Recorded before any shard is claimable again.
	if err := un.Watermarks().AddOutage(ctx, shard.Outage{Start: since, End: g.o.Now().UnixMilli()}); err != nil {
		return err
	}
	g.o.Store.SetGeneration(gen)
	if err := g.restoreAlarms(ctx, alarms, lost, &n); err != nil {
		return err
	}
	end := g.o.Now().UnixMilli()
	if err := un.Watermarks().AddOutage(ctx, shard.Outage{Start: since, End: end}); err != nil {
		return err
	}
	if err := un.WriteGeneration(ctx, gen, end); err != nil {
		return err
	}
	g.adopt(shard.GenRecord{ID: gen, Seq: 1})
	if err := g.recordMeta(ctx, gen); err != nil {
		return err
	}
	g.m.restoredDevices.Set(float64(n.Devices))
	took := time.Since(start)
	// Judged after the restore, which compared Redis with the registry: a
	// restart that kept its data (its append-only file whole) is routine.
	switch {
	case certain:
	case g.o.Registry != nil && n.Missing == 0 && n.Recovered == 0:
		g.o.Log.Info("Redis restarted; checked against the registry: nothing missing", "devices", n.Devices,
			"reason", why, "generation", gen, "took", took)
		return nil
	default:
		g.m.losses.Inc()
		g.o.Log.Error("Redis lost data", "reason", why, "missing", n.Missing, "devices", n.Devices)
		g.publish(ctx, "redis_data_loss", "redis_data_loss@"+gen, map[string]any{"reason": why, "since": since, "missing": n.Missing})
	}
	g.o.Log.Warn("Redis restored from the registry", "generation", gen, "devices", n.Devices, "missing", n.Missing, "rearmed", n.Rearmed,
		"lost", n.Lost, "recovered_in_outage", n.Recovered, "alarms", n.Alarms, "shards", t.Shards, "epoch", t.Epoch,
		"outage_start", since, "outage_end", end, "took", took)
	g.publish(ctx, "redis_restored", "redis_restored@"+gen, map[string]any{
		"reason": why, "generation": gen, "devices": n.Devices, "rearmed": n.Rearmed, "lost": n.Lost,
		"recovered": n.Recovered, "alarms": n.Alarms, "shards": t.Shards, "epoch": t.Epoch,
		"outage_start": since, "outage_end": end, "took_ms": took.Milliseconds(),
	})
	return nil
}

// restoreTopology writes a topology no lower than any seen: the highest
// of the registry's record, the watcher's and what Redis still holds,
// with an epoch above all of them. A doubling that was draining keeps
// draining only if Redis still holds its old shards' data.
func restoreTopology(ctx context.Context, s *shard.Store, seen shard.Topology, w *shard.Watcher, initial int, now time.Time) (shard.Topology, error) {
	best := shard.Topology{Shards: initial}
	cands := []shard.Topology{seen}
	if w != nil {
		cands = append(cands, w.Current())
	}
	cur, err := s.Topology(ctx)
	inRedis := err == nil
	if err != nil && !errors.Is(err, shard.ErrNoTopology) {
		return shard.Topology{}, err
	}
	if inRedis {
		cands = append(cands, cur)
	}
	for _, c := range cands {
		if c.Shards > 0 && (c.Epoch > best.Epoch || c.Epoch == best.Epoch && c.Shards > best.Shards) {
			best = c
		}
	}
	t := shard.Topology{Shards: best.Shards, Epoch: best.Epoch + 1, Since: now.UnixMilli()}
	switch {
	case inRedis && cur.Shards == t.Shards:
		t.Prev = cur.Prev
	case inRedis && cur.Shards*2 == t.Shards:
		t.Prev = cur.Shards // Redis went back to before the doubling
	case best.Prev != 0 && inRedis:
		t.Prev = best.Prev
	}
	if err := s.RestoreTopology(ctx, t); err != nil {
		return shard.Topology{}, err
	}
	if w != nil {
		w.Set(t)
	}
	return t, nil
}

// restoreDevices puts back one batch of registry records: registry
// entries, lost marks, overrides and groups; a lost device's entry that a rollback
// brought back is removed (a later score is a signal stored after its
// loss: it recovered); every other device is re-armed a threshold from
// now, which the outage rule then moves to a threshold after the outage.
func (g *Guard) restoreDevices(ctx context.Context, s *shard.Store, t shard.Topology, recs []dispatch.DeviceRecord, now time.Time, n *restored) error {
	if len(recs) == 0 {
		return nil
	}
	devs := make([]shard.Restored, len(recs))
	var lost []shard.Entry
	byShard := make(map[int][]shard.Entry)
	for j, r := range recs {
		devs[j] = shard.Restored{ID: r.ID, Type: r.Type, Group: r.Group, Threshold: time.Duration(r.Threshold) * time.Millisecond,
			LostDeadline: r.LostDeadline, LostAt: r.LostAt}
		if r.LostDeadline != 0 {
			lost = append(lost, shard.Entry{ID: r.ID, Deadline: r.LostDeadline})
			continue
		}
		thr := g.o.Thresholds.Rearm(r.ID, r.Type)
		if r.Threshold > 0 {
			thr = devs[j].Threshold
		}
		i := shard.Of(r.ID, t.Shards)
		byShard[i] = append(byShard[i], shard.Entry{ID: r.ID, Deadline: now.Add(thr).UnixMilli()})
	}
	// A lost device whose mark Redis no longer holds is missing.
	ids := make([]string, len(lost))
	for j, e := range lost {
		ids[j] = e.ID
	}
	marks, err := s.LostMarks().Of(ctx, ids)
	if err != nil {
		return err
	}
	for j, e := range lost {
		if marks[j] < e.Deadline {
			n.Missing++
		}
	}
	if err := s.RestoreRegistry(ctx, devs); err != nil {
		return err
	}
	left, err := s.DropFired(ctx, t, lost)
	if err != nil {
		return err
	}
	// A live device without a deadline in Redis is missing.
	added, err := s.Upsert(ctx, shard.Deadlines, byShard)
	if err != nil {
		return err
	}
	n.Missing += len(added)
	n.Devices += len(recs)
	n.Rearmed += len(recs) - len(lost)
	n.Lost += len(lost)
	for j, e := range lost {
		if left[j] > e.Deadline {
			n.Recovered++
			g.recoveredInOutage(ctx, recs, e, left[j])
		}
	}
	return nil
}

// recoveredInOutage handles a lost device whose entry holds a later score
// than its loss: it signalled after it was lost, in data the loss kept.
// Its recovery goes out (its id makes a repeat harmless), and its mark is
// cleared.
func (g *Guard) recoveredInOutage(ctx context.Context, recs []dispatch.DeviceRecord, e shard.Entry, score int64) {
	typ := ""
	for _, r := range recs {
		if r.ID == e.ID {
			typ = r.Type
		}
	}
	thr := g.o.Thresholds.For(e.ID, typ)
	if _, _, err := g.o.Store.Unchecked().LostMarks().Clear(ctx, e.ID, e.Deadline); err != nil {
		g.o.Log.Warn("lost mark of a device that recovered during the outage not cleared", "device", e.ID, "err", err)
	}
	if g.o.Registry != nil {
		g.o.Registry.Update(ctx, []string{e.ID}, func(r *dispatch.DeviceRecord, _ bool) (bool, bool) {
			if r.LostDeadline == 0 || r.LostDeadline > e.Deadline {
				return false, false
			}
			r.LostDeadline, r.LostAt = 0, 0
			return true, false
		})
	}
	ev := dispatch.Recovered{ID: dispatch.RecoveredID(e.ID, e.Deadline), Device: e.ID, Type: typ,
		LostAt: e.Deadline, RecoveredAt: score - thr.Milliseconds()}
	if msg, err := dispatch.Encode(g.o.Pub.Subjects(), ev); err == nil {
		if err := g.o.Pub.Publish(ctx, []dispatch.Message{msg})[0]; err != nil {
			g.o.Log.Warn("recovered event not published", "device", e.ID, "err", err)
		}
	}
}

// publish sends a system event; a failure is logged (NATS may be what is
// down).
func (g *Guard) publish(ctx context.Context, kind, id string, details map[string]any) {
	if g.o.Pub == nil {
		return
	}
	ev := dispatch.System{ID: id, Kind: kind, At: g.o.Now().UnixMilli(), Details: details}
	msg, err := dispatch.Encode(g.o.Pub.Subjects(), ev)
	if err == nil {
		err = g.o.Pub.Publish(ctx, []dispatch.Message{msg})[0]
	}
	if err != nil {
		g.o.Log.Warn("system event not published", "kind", kind, "err", err)
	}
}
