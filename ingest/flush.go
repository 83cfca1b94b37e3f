package ingest

import (
	"cmp"
	"context"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/backoff"
	"github.com/sigwatch/sigwatch/shard"
)

// storeBackoff spaces the attempts of a failed Redis call: 10ms doubling to
// 1s, jittered so that flushers do not retry in step.
var storeBackoff = backoff.Policy{Base: 10 * time.Millisecond, Max: time.Second}

// flush stores one batch and acks its signals. Each id's latest deadline
// is written once per batch. A failed write is retried (it is idempotent)
// until it succeeds or ctx ends; nothing is acked before it is stored.
// idx and es are scratch space, es is returned for reuse. beat is the flush
// loop's, called before each attempt of a call.
func (p *pipeline) flush(ctx context.Context, b *batch, idx map[string]int, es []shard.Entry, beat func()) []shard.Entry {
	clear(idx)
	var lowers int
	for _, s := range b.items {
		if s.lower != "" {
			lowers++
			continue
		}
		if j, ok := idx[s.id]; ok {
			es[j].Deadline = max(es[j].Deadline, s.deadline)
			continue
		}
		idx[s.id] = len(es)
		es = append(es, shard.Entry{ID: s.id, Deadline: s.deadline})
	}
	p.m.batchSize.Observe(float64(len(b.items)))

	ok := p.recordDeclared(ctx, b, idx, es, beat)
	var stale map[string]bool
	var added []string
	if ok && len(es) > 0 {
		added, ok = p.upsert(ctx, es, p.admit(b, &stale), beat)
	}
	for _, id := range added {
		delete(stale, id)
	}
	if ok && len(added) > 0 {
		ok = p.welcome(ctx, b, added, beat)
	}
	// Offline reports come after the signals of their batch: a signal
	// before a report is then lowered with it, one after it stands.
	if ok && lowers > 0 {
		ok = p.lowerAll(ctx, b, beat)
	}
	if !ok {
		p.abandon(b)
		return es
	}
	for _, s := range b.items {
		if s.msg != nil {
			s.msg.Ack()
		} else {
			s.done <- nil
		}
		<-p.slots
	}
	var refused int
	if len(stale) > 0 {
		for _, s := range b.items {
			if stale[s.id] {
				refused++
			}
		}
		p.m.stale.Add(float64(refused))
		p.errLog.Warn(p.log, "stale", "signals older than their device's loss refused (late delivery)", "signals", refused, "devices", len(stale))
	}
	p.m.signals.Add(float64(len(b.items) - refused - lowers))
	p.m.resets.Add(float64(max(0, len(b.items)-refused-lowers-len(added))))
	p.wm.completed(b.seq)
	return es
}

// admit returns the admission rule for the ids of b found absent from their
// shard (docs/guarantees.md, guarantee 7). An absent device is new, or was lost: its
// entry is removed only after its lost mark is stored, so the mark read here
// is the evidence of the loss. A signal is admitted unless the earliest
// deadline its evidence supports (lo plus the threshold) is not after the
// deadline the device was declared lost at: such a signal may be older than
// the loss (a stalled replica's backlog, a redelivery), and must not bring
// the device back. Refused ids are put in *stale (made on the first); their
// signals are acked and not stored.
func (p *pipeline) admit(b *batch, stale *map[string]bool) shard.Admit {
	return func(ctx context.Context, absent []shard.Entry) ([]shard.Entry, error) {
		ids := make([]string, len(absent))
		floor := make(map[string]int64, len(absent))
		for j, e := range absent {
			ids[j] = e.ID
			floor[e.ID] = 0
		}
		for _, s := range b.items {
			if f, ok := floor[s.id]; ok {
				floor[s.id] = max(f, s.deadline-s.at+s.lo)
			}
		}
		marks, err := p.store.LostMarks().Of(ctx, ids)
		if err != nil {
			return nil, err
		}
		out := make([]shard.Entry, 0, len(absent))
		for j, e := range absent {
			if marks[j] != 0 && floor[e.ID] <= marks[j] {
				if *stale == nil {
					*stale = make(map[string]bool)
				}
				(*stale)[e.ID] = true
				continue
			}
			out = append(out, e)
		}
		return out, nil
	}
}

// abandon gives up on a batch that could not be stored before ingest
// stopped. Its messages stay unacked: a persistent session gets them again
// next run, a clean (shared) one loses them, which is why the member then
// stays in its group's watermark (Run). Its flush never completes, so no
// later probe advances the watermark.
func (p *pipeline) abandon(b *batch) {
	p.abandoned.Store(true)
	for _, s := range b.items {
		if s.done != nil {
			s.done <- ErrStopped
		}
		<-p.slots
	}
	p.log.Warn("stopped before signals were stored; left unacked", "signals", len(b.items))
}

// upsert writes es, adding absent ids only if admit admits them, retrying
// with back-off. The writer places them by the topology it knows, all
// shards in one round trip, and places again what a shard refuses because a
// doubling moved on. It returns the ids that were
// absent, gathered over every attempt (an attempt that failed for one shard
// may have written others).
func (p *pipeline) upsert(ctx context.Context, es []shard.Entry, admit shard.Admit, beat func()) ([]string, bool) {
	var added []string
	for attempt := 0; ; attempt++ {
		beat()
		start := time.Now()
		actx, cancel := context.WithTimeout(ctx, storeTimeout)
		a, err := p.writer.Upsert(actx, shard.Deadlines, es, admit)
		cancel()
		p.m.storeLatency.Observe(time.Since(start).Seconds())
		added = append(added, a...)
		if err == nil {
			return added, true
		}
		if !p.retry(ctx, attempt, "store deadlines", err) {
			return nil, false
		}
	}
}

// retry counts and logs a failed store call and waits before the next
// attempt. It returns false if ctx ended.
func (p *pipeline) retry(ctx context.Context, attempt int, what string, err error) bool {
	p.m.storeErrors.Inc()
	if ctx.Err() == nil {
		p.errLog.Warn(p.log, "store", "retrying: "+what+" failed", "err", err, "attempt", attempt+1)
	}
	return backoff.Wait(ctx, storeBackoff.Delay(attempt))
}

// welcome handles ids that were absent from their shard: it records them in
// the registry, all in one round trip, and publishes the recoveries of the
// devices that were lost, in one batch. It returns false only if ingest
// stopped before the registry was written.
func (p *pipeline) welcome(ctx context.Context, b *batch, added []string, beat func()) bool {
	latest := make(map[string]signal, len(added))
	for _, id := range added {
		latest[id] = signal{}
	}
	for _, s := range b.items {
		if l, ok := latest[s.id]; ok && s.at >= l.at && s.lower == "" {
			latest[s.id] = s
		}
	}
	todo := make([]shard.Sighting, 0, len(latest))
	for id, s := range latest {
		if s.id != "" { // always in this batch
			todo = append(todo, shard.Sighting{ID: id, Type: s.typ, Group: s.group})
		}
	}
	var back []dispatch.Recovered
	// groups are the groups the devices have now (the signal's, else the
	// one they had); regrouped the devices back from being lost whose group
	// changed: the durable registry learns it with the new devices.
	groups := make(map[string]string, len(todo))
	regrouped := map[string]bool{}
	for attempt := 0; len(todo) > 0; attempt++ {
		beat()
		actx, cancel := context.WithTimeout(ctx, storeTimeout)
		p.store.SeenMulti(actx, todo, p.opts.Now().UnixMilli())
		cancel()
		var err error
		failed := todo[:0:0]
		for _, d := range todo {
			if d.Err != nil {
				err = d.Err
				failed = append(failed, d)
				continue
			}
			if !d.Existed {
				p.m.newDevices.Inc()
			}
			groups[d.ID] = cmp.Or(latest[d.ID].group, d.Prev.Group)
			if d.Prev.LostDeadline != 0 {
				s := latest[d.ID]
				typ := s.typ
				if typ == "" {
					typ = d.Prev.Type
				}
				group := groups[d.ID]
				if group != d.Prev.Group {
					regrouped[d.ID] = true
				}
				back = append(back, dispatch.Recovered{
					ID:          dispatch.RecoveredID(d.ID, d.Prev.LostDeadline),
					Device:      d.ID,
					Type:        typ,
					LostAt:      d.Prev.LostDeadline,
					RecoveredAt: s.at,
					Group:       group,
				})
			}
		}
		if todo = failed; len(todo) > 0 && !p.retry(ctx, attempt, "record device", err) {
			// The registry entries already written stand; their recoveries
			// still go out.
			p.recovered(ctx, back)
			return false
		}
	}
	ok := p.remember(ctx, latest, groups, back, regrouped, beat)
	beat()
	p.recovered(ctx, back)
	return ok
}

// remember writes the devices of a flush that were absent, and not back
// from being lost, into the durable registry before their signals are
// acked, retrying until that succeeds or ingest stops: a Redis that loses
// them does not make sigwatch forget them. A new device costs one
// asynchronous publish. A recovery's event is in the stream, where a
// restore reads it; the registry's copy catches up at its next checkpoint.
// A device's group is its groups entry (one set through the API before it
// was first seen included); a recovered device whose group changed
// (regrouped) is written like a new one: its group is in no event.
func (p *pipeline) remember(ctx context.Context, latest map[string]signal, groups map[string]string, back []dispatch.Recovered, regrouped map[string]bool, beat func()) bool {
	reg := p.opts.Registry
	if reg == nil || len(latest) == 0 {
		return true
	}
	cleared := make(map[string]int64, len(back))
	for _, ev := range back {
		cleared[ev.Device] = ev.LostAt
	}
	merge := func(r *dispatch.DeviceRecord, exists bool) (bool, bool) {
		keep := !exists
		if t := latest[r.ID].typ; t != "" && t != r.Type {
			r.Type, keep = t, true
		}
		if g := groups[r.ID]; g != "" && g != r.Group {
			r.Group, keep = g, true
		}
		return keep, false
	}
	var recs []dispatch.DeviceRecord
	for id, s := range latest {
		switch {
		case s.id == "":
		case cleared[id] != 0 && !regrouped[id]:
		default:
			recs = append(recs, dispatch.DeviceRecord{ID: id, Type: s.typ, Group: groups[id]})
		}
	}
	for attempt := 0; len(recs) > 0; attempt++ {
		beat()
		actx, cancel := context.WithTimeout(ctx, storeTimeout)
		errs := reg.Add(actx, recs, merge)
		cancel()
		var err error
		failed := recs[:0:0]
		for j, e := range errs {
			if e != nil {
				err = e
				failed = append(failed, recs[j])
			}
		}
		if recs = failed; len(recs) > 0 && !p.retry(ctx, attempt, "record devices in the registry", err) {
			return false
		}
	}
	return true
}

// recovered publishes recoveries, in one batch. The registry already has
// the devices back, so a failure here is logged, not retried forever: NATS
// being down must not stop ingest.
func (p *pipeline) recovered(ctx context.Context, evs []dispatch.Recovered) {
	if len(evs) == 0 {
		return
	}
	if p.pub == nil {
		for _, ev := range evs {
			p.m.recovered.Inc()
			p.log.Info("device recovered", "device", ev.Device, "type", ev.Type, "lost_at", ev.LostAt)
		}
		return
	}
	msgs := make([]dispatch.Message, 0, len(evs))
	sent := make([]dispatch.Recovered, 0, len(evs))
	for _, ev := range evs {
		msg, err := dispatch.Encode(p.pub.Subjects(), ev)
		if err != nil {
			p.log.Error("recovered event not published", "device", ev.Device, "id", ev.ID, "err", err)
			continue
		}
		msgs = append(msgs, msg)
		sent = append(sent, ev)
	}
	for j, err := range publishEvents(ctx, p.pub, msgs) {
		if err != nil {
			p.log.Error("recovered event not published", "device", sent[j].Device, "id", sent[j].ID, "err", err)
			continue
		}
		p.m.recovered.Inc()
	}
}
