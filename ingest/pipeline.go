package ingest

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// signal is one unit of work on its way to Redis: a device's new deadline,
// and how to report that it is stored. A signal with probe set is instead
// the barrier of the watermark probe sent at that time.
type signal struct {
	id, typ  string
	shard    int
	at       int64 // signal time, unix ms
	deadline int64 // unix ms
	msg      mqtt.Message
	done     chan error
	probe    int64
}

// batch is the signals of one flush. seq numbers flushes in the order the
// collector cut them.
type batch struct {
	seq   uint64
	items []signal
}

// collect groups signals into batches, in the order they were received, and
// hands each batch to the flushers when one of its shards holds BatchSize
// signals, when its oldest signal has waited FlushInterval, or when a probe
// barrier arrives. It returns, closing flushes, once work is closed.
func (in *Ingest) collect(flushes chan<- *batch) {
	defer close(flushes)
	var (
		b      = &batch{items: make([]signal, 0, in.opts.BatchSize)}
		counts []int // signals per shard in b
		seq    uint64
		timer  = time.NewTimer(time.Hour)
	)
	timer.Stop()
	cut := func() {
		if len(b.items) == 0 {
			return
		}
		timer.Stop()
		seq++
		b.seq = seq
		flushes <- b
		b = &batch{items: make([]signal, 0, in.opts.BatchSize)}
		clear(counts)
	}
	for {
		select {
		case s, ok := <-in.work:
			if !ok {
				cut()
				return
			}
			if s.probe != 0 {
				// Every signal received before the probe is in a batch
				// numbered seq or lower once this cut is made.
				cut()
				if ms, ok := in.track.barrier(seq, s.probe); ok {
					in.ready(ms)
				}
				continue
			}
			if len(b.items) == 0 {
				timer.Reset(in.opts.FlushInterval)
			}
			b.items = append(b.items, s)
			if s.shard >= len(counts) {
				counts = append(counts, make([]int, s.shard+1-len(counts))...)
			}
			counts[s.shard]++
			if counts[s.shard] >= in.opts.BatchSize {
				cut()
			}
		case <-timer.C:
			cut()
		}
	}
}

// flusher stores batches until flushes is closed.
func (in *Ingest) flusher(flushes <-chan *batch) {
	idx := make(map[string]int)
	var es []shard.Entry
	for b := range flushes {
		es = in.flush(b, idx, es[:0])
	}
}

// flush stores one batch and acks its signals. Each id's latest deadline
// is written once per batch. A failed write is retried (it is idempotent)
// until it succeeds or ingest has stopped waiting; nothing is acked before
// it is stored. idx and es are scratch space, es is returned for reuse.
func (in *Ingest) flush(b *batch, idx map[string]int, es []shard.Entry) []shard.Entry {
	ctx := in.storeCtx
	clear(idx)
	for _, s := range b.items {
		if j, ok := idx[s.id]; ok {
			es[j].Deadline = max(es[j].Deadline, s.deadline)
			continue
		}
		idx[s.id] = len(es)
		es = append(es, shard.Entry{ID: s.id, Deadline: s.deadline})
	}
	in.m.batchSize.Observe(float64(len(b.items)))

	added, ok := in.upsert(ctx, es)
	if ok && len(added) > 0 {
		ok = in.welcome(ctx, b, added)
	}
	if !ok {
		in.abandon(b)
		return es
	}
	for _, s := range b.items {
		if s.msg != nil {
			s.msg.Ack()
		} else {
			s.done <- nil
		}
		<-in.slots
	}
	in.m.signals.Add(float64(len(b.items)))
	in.m.resets.Add(float64(max(0, len(b.items)-len(added))))
	if ms, ok := in.track.complete(b.seq); ok {
		in.ready(ms)
	}
	return es
}

// abandon gives up on a batch that could not be stored before ingest
// stopped. Its messages stay unacked, so the broker delivers them again;
// its flush never completes, so no later probe advances the watermark.
func (in *Ingest) abandon(b *batch) {
	in.abandoned.Store(true)
	for _, s := range b.items {
		if s.done != nil {
			s.done <- ErrStopped
		}
		<-in.slots
	}
	in.log.Warn("stopped before signals were stored; the broker delivers them again", "signals", len(b.items))
}

// storeTimeout bounds one attempt of a Redis call. Without a deadline the
// client keeps retrying a dead connection inside the call, and nothing would
// be counted or logged.
const storeTimeout = 3 * time.Second

// upsert writes es, retrying with back-off. The writer places them by the
// topology it knows, all shards in one round trip, and places again what a
// shard refuses because a doubling moved on. It returns the ids that were
// absent, gathered over every attempt (an attempt that failed for one shard
// may have written others).
func (in *Ingest) upsert(ctx context.Context, es []shard.Entry) ([]string, bool) {
	var added []string
	for attempt := 0; ; attempt++ {
		start := time.Now()
		actx, cancel := context.WithTimeout(ctx, storeTimeout)
		a, err := in.writer.Upsert(actx, shard.Deadlines, es)
		cancel()
		in.m.storeLatency.Observe(time.Since(start).Seconds())
		added = append(added, a...)
		if err == nil {
			return added, true
		}
		if !in.retry(ctx, attempt, "store deadlines", err) {
			return nil, false
		}
	}
}

// retry counts and logs a failed store call and waits before the next
// attempt. It returns false if ctx ended.
func (in *Ingest) retry(ctx context.Context, attempt int, what string, err error) bool {
	in.m.storeErrors.Inc()
	if ok, suppressed := in.storeLog.allow(in.now()); ok && ctx.Err() == nil {
		in.log.Warn("retrying: "+what+" failed", "err", err, "attempt", attempt+1, "suppressed", suppressed)
	}
	return sleep(ctx, backoff(attempt))
}

// welcome handles ids that were absent from their shard: it records them in
// the registry, all in one round trip, and publishes the recoveries of the
// devices that were lost, in one batch. It returns false only if ingest
// stopped before the registry was written.
func (in *Ingest) welcome(ctx context.Context, b *batch, added []string) bool {
	latest := make(map[string]signal, len(added))
	for _, id := range added {
		latest[id] = signal{}
	}
	for _, s := range b.items {
		if l, ok := latest[s.id]; ok && s.at >= l.at {
			latest[s.id] = s
		}
	}
	todo := make([]shard.Sighting, 0, len(latest))
	for id, s := range latest {
		if s.id != "" { // always in this batch
			todo = append(todo, shard.Sighting{ID: id, Type: s.typ})
		}
	}
	var back []dispatch.Recovered
	for attempt := 0; len(todo) > 0; attempt++ {
		actx, cancel := context.WithTimeout(ctx, storeTimeout)
		in.store.SeenMulti(actx, todo, in.now().UnixMilli())
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
				in.m.newDevices.Inc()
			}
			if d.Prev.LostDeadline != 0 {
				s := latest[d.ID]
				typ := s.typ
				if typ == "" {
					typ = d.Prev.Type
				}
				back = append(back, dispatch.Recovered{
					ID:          dispatch.RecoveredID(d.ID, d.Prev.LostDeadline),
					Device:      d.ID,
					Type:        typ,
					LostAt:      d.Prev.LostDeadline,
					RecoveredAt: s.at,
				})
			}
		}
		if todo = failed; len(todo) > 0 && !in.retry(ctx, attempt, "record device", err) {
			// The registry entries already written stand; their recoveries
			// still go out.
			in.recovered(ctx, back)
			return false
		}
	}
	in.recovered(ctx, back)
	return true
}

// publishAttempts bounds how often an event (recovered, invalid) is tried
// before it is logged as lost; each attempt waits at most publishWait.
const (
	publishAttempts = 3
	publishWait     = 2 * time.Second
)

// recovered publishes recoveries, in one batch. The registry already has
// the devices back, so a failure here is logged, not retried forever: NATS
// being down must not stop ingest.
func (in *Ingest) recovered(ctx context.Context, evs []dispatch.Recovered) {
	if len(evs) == 0 {
		return
	}
	if in.pub == nil {
		for _, ev := range evs {
			in.m.recovered.Inc()
			in.log.Info("device recovered", "device", ev.Device, "type", ev.Type, "lost_at", ev.LostAt)
		}
		return
	}
	msgs := make([]dispatch.Message, 0, len(evs))
	sent := make([]dispatch.Recovered, 0, len(evs))
	for _, ev := range evs {
		msg, err := dispatch.Encode(in.pub.Subjects.Recovered(ev.Type), ev.ID, ev)
		if err != nil {
			in.log.Error("recovered event not published", "device", ev.Device, "id", ev.ID, "err", err)
			continue
		}
		msgs = append(msgs, msg)
		sent = append(sent, ev)
	}
	for j, err := range in.publish(ctx, msgs) {
		if err != nil {
			in.log.Error("recovered event not published", "device", sent[j].Device, "id", sent[j].ID, "err", err)
			continue
		}
		in.m.recovered.Inc()
	}
}

// publish publishes msgs, retrying the failed ones, and returns the errors
// of the last attempt.
func (in *Ingest) publish(ctx context.Context, msgs []dispatch.Message) []error {
	errs := make([]error, len(msgs))
	todo := make([]int, len(msgs))
	for j := range todo {
		todo[j] = j
	}
	for attempt := 0; attempt < publishAttempts && len(todo) > 0; attempt++ {
		if attempt > 0 && !sleep(ctx, backoff(attempt+3)) {
			break
		}
		batch := make([]dispatch.Message, len(todo))
		for k, j := range todo {
			batch[k] = msgs[j]
		}
		pctx, cancel := context.WithTimeout(ctx, publishWait)
		res := in.pub.Publish(pctx, batch)
		cancel()
		var again []int
		for k, j := range todo {
			if errs[j] = res[k]; errs[j] != nil {
				again = append(again, j)
			}
		}
		todo = again
	}
	return errs
}

// tracker knows which flushes have completed, and which probe barriers are
// therefore passed: a barrier cut after flush n is passed once every flush
// numbered n or lower has completed. Flushes complete out of order.
type tracker struct {
	mu       sync.Mutex
	done     uint64              // every flush numbered done or lower has completed
	ahead    map[uint64]struct{} // completed flushes above done
	barriers []barrier           // not yet passed, in order
}

type barrier struct {
	after uint64
	probe int64
}

// barrier registers the barrier of the probe sent at probe, cut after flush
// after. ok reports that it is already passed.
func (t *tracker) barrier(after uint64, probe int64) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if after <= t.done && len(t.barriers) == 0 {
		return probe, true
	}
	t.barriers = append(t.barriers, barrier{after, probe})
	return t.passed()
}

// complete records that flush seq completed and returns the latest probe
// time whose barrier is now passed, if any.
func (t *tracker) complete(seq uint64) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ahead[seq] = struct{}{}
	for {
		if _, ok := t.ahead[t.done+1]; !ok {
			break
		}
		delete(t.ahead, t.done+1)
		t.done++
	}
	return t.passed()
}

func (t *tracker) passed() (ms int64, ok bool) {
	n := 0
	for n < len(t.barriers) && t.barriers[n].after <= t.done {
		ms = max(ms, t.barriers[n].probe)
		n++
	}
	if n == 0 {
		return 0, false
	}
	t.barriers = append(t.barriers[:0], t.barriers[n:]...)
	return ms, true
}

// ready records that the watermark may advance to ms and wakes the advancer.
func (in *Ingest) ready(ms int64) {
	for {
		cur := in.readyWM.Load()
		if ms <= cur || in.readyWM.CompareAndSwap(cur, ms) {
			break
		}
	}
	select {
	case in.wmKick <- struct{}{}:
	default:
	}
}

// advance stores this member's watermark whenever a probe barrier passes,
// until stop is closed; then it stores the last one that passed. The store
// moves the global watermark to what the members together have consumed.
func (in *Ingest) advance(stop <-chan struct{}) {
	var stored int64
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	store := func() {
		ms := in.readyWM.Load()
		if ms <= stored {
			return
		}
		ctx, cancel := context.WithTimeout(in.storeCtx, storeTimeout)
		_, err := in.store.AdvanceMember(ctx, in.member(), ms, in.now(), in.opts.MemberTimeout, in.opts.OutageAfter)
		cancel()
		if err != nil {
			in.m.storeErrors.Inc()
			if ok, suppressed := in.storeLog.allow(in.now()); ok {
				in.log.Warn("advance watermark failed", "err", err, "suppressed", suppressed)
			}
			retry.Reset(in.opts.ProbeInterval)
			return
		}
		stored = ms
		in.watermark.Store(ms)
	}
	for {
		select {
		case <-stop:
			store()
			return
		case <-in.wmKick:
			store()
		case <-retry.C:
			store()
		}
	}
}

// backoff is the wait before retry attempt+1: 10ms doubling to 1s, with
// jitter so that flushers do not retry in step.
func backoff(attempt int) time.Duration {
	d := 10 * time.Millisecond << min(attempt, 7)
	d = min(d, time.Second)
	return d/2 + rand.N(d/2+1)
}

// sleep waits d, and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
