package scanner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// shardLoop is the state of one held lease and the loop that scans it.
type shardLoop struct {
	lease    shard.Lease
	stop     chan struct{} // closed to ask for a stop after the in-flight batch
	stopOnce sync.Once
	cancel   context.CancelFunc // the hard stop, when the lease is lost
	lost     atomic.Bool
}

func (l *shardLoop) requestStop() { l.stopOnce.Do(func() { close(l.stop) }) }

// releaseTimeout bounds the release of a lease after its loop has ended.
const releaseTimeout = 2 * time.Second

// runShard scans one shard until it is asked to stop, its lease is lost or
// ctx is cancelled, then releases the lease if it still holds it.
func (s *Scanner) runShard(ctx context.Context, l *shardLoop) {
	i := l.lease.Shard
	defer func() {
		if l.lost.Load() || s.killed.Load() {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if err := s.store.Release(rctx, l.lease); err != nil {
			s.log.Warn("lease release failed; it expires by itself", "shard", i, "err", err)
		}
		s.log.Debug("shard released", "shard", i)
	}()
	var bo backoff
	for {
		select {
		case <-l.stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		wait, wake, err := s.step(ctx, i, l.lease)
		switch {
		case errors.Is(err, shard.ErrNotOwner):
			s.leaseLost(l, "scan")
			return
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			s.warn.Warn(fmt.Sprint("shard", i), "scan failed; retrying", "shard", i, "err", err)
			wait = bo.next()
		default:
			bo.reset()
		}
		if wait > 0 && !sleepOrWake(ctx, l.stop, wait, wake) {
			return
		}
	}
}

// sleep waits for d and reports whether the loop should go on.
func sleep(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	return sleepOrWake(ctx, stop, d, nil)
}

// sleepOrWake is sleep that also ends early when wake is closed.
func sleepOrWake(ctx context.Context, stop <-chan struct{}, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-wake:
		return true
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	}
}

// step claims and handles one batch of shard i and returns how long to wait
// before the next claim, and a channel that ends the wait early: closed
// when the watermark moves, if what is due waits only for it.
func (s *Scanner) step(ctx context.Context, i int, lease shard.Lease) (time.Duration, <-chan struct{}, error) {
	now := s.opts.Now()
	wm, outages, err := s.wm.get(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("scanner: shard %d: %w", i, err)
	}
	if wm == 0 {
		// Ingest never ran: nothing is known to be silent.
		return s.opts.Poll, nil, nil
	}
	s.m.watermarkLag.Set(float64(now.UnixMilli()-wm) / 1e3)
	horizon := min(now.UnixMilli(), wm)
	c, err := s.store.Claim(ctx, s.opts.Family, i, lease, horizon, s.opts.Batch)
	if err != nil {
		return 0, nil, err
	}
	due := c.Due
	if len(due) == 0 {
		wait := s.opts.Poll
		if c.HasHead {
			d := time.UnixMilli(c.Head.Deadline).Sub(now)
			if d <= 0 {
				// Due by the clock but not by the watermark: claim again as
				// soon as a later watermark is read, within a poll.
				return wait, s.wm.wait(wm), nil
			}
			wait = min(wait, d)
		}
		return wait, nil, nil
	}
	s.m.batchSize.Observe(float64(len(due)))

	// While a doubling drains, moved members are checked against their
	// partner shard first; stale copies are removed without firing.
	var stale []shard.Entry
	if prev, cur, ok := crossing(s.topo.Current(), c.Layout); ok {
		if due, stale, err = s.cross(ctx, i, prev, cur, due); err != nil {
			return 0, nil, err
		}
	}

	var (
		handled []shard.Entry
		moves   []shard.Move
		fired   map[string]firedLost
		fireErr error
	)
	switch {
	case len(due) == 0:
	case s.opts.Fire != nil:
		handled, moves = s.opts.Fire(ctx, i, due, now)
		if left := len(due) - len(handled) - len(moves); left > 0 {
			// Back off rather than claim the same entries again at once.
			fireErr = fmt.Errorf("scanner: shard %d: %d of %d due entries not handled; retrying", i, left, len(due))
		}
	default:
		handled, moves, fired, fireErr = s.fireLost(ctx, i, due, outages, now)
	}
	handled = append(handled, stale...)
	if s.afterPublish != nil {
		s.afterPublish(i)
	}
	if len(handled)+len(moves) > 0 {
		st, err := s.store.Settle(ctx, s.opts.Family, i, lease, handled, moves)
		if err != nil {
			return 0, nil, err
		}
		s.m.deferred.Add(float64(st.Moved))
		s.m.revived.Add(float64(len(st.Revived)))
		if s.opts.Fire == nil {
			for _, r := range st.Revived {
				if err := s.recovered(ctx, r, fired[r.ID]); err != nil {
					return 0, nil, err
				}
			}
		}
	}
	if fireErr != nil {
		// What was not published stays in the shard and is claimed again.
		return 0, nil, fireErr
	}
	return 0, nil, nil
}

// firedLost is what recovery needs to know about a published lost event.
type firedLost struct {
	typ       string
	deadline  int64
	threshold time.Duration
}

// fireLost publishes the lost events of due, deferring the entries the
// outage rule protects, and marks the published devices lost. It returns the
// entries to remove (published and marked) and the deferrals. An error says
// some entries were neither; they stay and are retried.
func (s *Scanner) fireLost(ctx context.Context, i int, due []shard.Entry, outages []shard.Outage, now time.Time) (handled []shard.Entry, moves []shard.Move, fired map[string]firedLost, err error) {
	ids := make([]string, len(due))
	for j, e := range due {
		ids[j] = e.ID
	}
	types, err := s.store.Types(ctx, ids)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("scanner: shard %d: %w", i, err)
	}
	firedAt := now.UnixMilli()
	fired = make(map[string]firedLost, len(due))
	msgs := make([]dispatch.Message, 0, len(due))
	sent := make([]shard.Entry, 0, len(due))
	for j, e := range due {
		typ := types[j]
		thr := s.opts.Thresholds.For(e.ID, typ)
		if to, ok := deferral(e.Deadline, thr, outages); ok {
			moves = append(moves, shard.Move{ID: e.ID, From: e.Deadline, To: to})
			continue
		}
		ev := dispatch.Lost{
			ID:       dispatch.LostID(e.ID, e.Deadline),
			Device:   e.ID,
			Type:     typ,
			Deadline: e.Deadline,
			LastSeen: e.Deadline - thr.Milliseconds(),
			FiredAt:  firedAt,
			Shard:    i,
		}
		msg, err := dispatch.Encode(s.pub.Subjects.Lost(typ), ev.ID, ev)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("scanner: encode lost event: %w", err)
		}
		msgs = append(msgs, msg)
		sent = append(sent, e)
		fired[e.ID] = firedLost{typ: typ, deadline: e.Deadline, threshold: thr}
	}

	errs := s.pub.Publish(ctx, msgs)
	acked := make([]shard.Entry, 0, len(sent))
	for j, e := range sent {
		if errs[j] != nil {
			s.m.publishErrors.Inc()
			if err == nil {
				err = fmt.Errorf("scanner: shard %d: %w", i, errs[j])
			}
			continue
		}
		acked = append(acked, e)
	}

	marked := s.store.MarkLostMulti(ctx, acked, firedAt)
	handled = make([]shard.Entry, 0, len(acked))
	for j, e := range acked {
		if marked[j] != nil {
			// Not removed: it is claimed and published again (JetStream drops
			// the duplicate) until the mark is stored.
			if err == nil {
				err = fmt.Errorf("scanner: shard %d: %w", i, marked[j])
			}
			continue
		}
		handled = append(handled, e)
		s.m.lost.Inc()
		s.m.fireLag.Observe(float64(firedAt-e.Deadline) / 1e3)
	}
	return handled, moves, fired, err
}

// deferral applies the outage rule (invariant 6): a device whose silence
// window [deadline-threshold, deadline] overlaps a recorded ingest outage is
// not declared lost; its deadline moves to a threshold after the last such
// outage ended.
func deferral(deadline int64, threshold time.Duration, outages []shard.Outage) (int64, bool) {
	since := deadline - threshold.Milliseconds()
	var to int64
	for _, o := range outages {
		if o.Start < deadline && o.End > since {
			to = max(to, o.End+threshold.Milliseconds())
		}
	}
	return to, to > 0
}

// recovered handles a fired entry that a reset revived between claim and
// settle: the device was declared lost and signalled again, so its lost mark
// is cleared and, if this call cleared it, a recovered event goes out. The
// event is retried until published; its id makes a repeat harmless.
func (s *Scanner) recovered(ctx context.Context, revived shard.Entry, f firedLost) error {
	if f.deadline == 0 {
		return nil // Not published by this batch, so not marked lost.
	}
	var bo backoff
	for {
		_, cleared, err := s.store.ClearLost(ctx, revived.ID, f.deadline)
		if err == nil && !cleared {
			return nil // Ingest saw the device come back and announced it.
		}
		if err == nil {
			break
		}
		s.warn.Warn("recovered", "lost mark not cleared; retrying", "device", revived.ID, "err", err)
		if !sleep(ctx, nil, bo.next()) {
			return fmt.Errorf("scanner: recover %s: %w", revived.ID, err)
		}
	}
	ev := dispatch.Recovered{
		ID:          dispatch.RecoveredID(revived.ID, f.deadline),
		Device:      revived.ID,
		Type:        f.typ,
		LostAt:      f.deadline,
		RecoveredAt: revived.Deadline - f.threshold.Milliseconds(),
	}
	msg, err := dispatch.Encode(s.pub.Subjects.Recovered(f.typ), ev.ID, ev)
	if err != nil {
		return fmt.Errorf("scanner: encode recovered event: %w", err)
	}
	bo.reset()
	for {
		err := s.pub.Publish(ctx, []dispatch.Message{msg})[0]
		if err == nil {
			return nil
		}
		s.m.publishErrors.Inc()
		s.warn.Warn("recovered", "recovered event not published; retrying", "device", revived.ID, "err", err)
		if !sleep(ctx, nil, bo.next()) {
			return fmt.Errorf("scanner: recovered event of %s: %w", revived.ID, err)
		}
	}
}

// backoff is the wait after a failed step: 50ms doubling up to 2s.
type backoff struct{ d time.Duration }

func (b *backoff) next() time.Duration {
	b.d = min(max(2*b.d, 50*time.Millisecond), 2*time.Second)
	return b.d
}

func (b *backoff) reset() { b.d = 0 }

// watermark shares one read of the ingest watermark among the shard loops.
// A step takes the last value read, reading it itself only when no read is
// younger than a poll (so an idle scanner reads it about once per poll, for
// all its shards). A loop whose head is due by the clock but not by the
// watermark waits for a later one instead (wait): while any does, the
// refresher (run, owned by Scanner.Run) reads the watermark every
// watermarkEvery and wakes the waiting loops as soon as it moved, rather
// than a poll later. An older watermark is never unsafe: it only holds
// firing back (invariant 6).
type watermark struct {
	store   *shard.Store
	maxAge  time.Duration
	refresh time.Duration
	kick    chan struct{} // wakes an idle refresher

	mu        sync.Mutex
	read      time.Time // when wm was read; real time, for freshness only
	wm        int64
	outages   []shard.Outage
	wantUntil time.Time // the refresher runs until then
	// outN and outLast are the length and last entry of the outage list
	// when outages was read.
	outN    int64
	outLast shard.Outage
	changed chan struct{} // closed, and replaced, when wm moves forward
}

// newWatermark returns a watermark read at least every maxAge while steps
// ask for it and, while loops wait for it to move, every refresh.
func newWatermark(store *shard.Store, maxAge, refresh time.Duration) *watermark {
	return &watermark{store: store, maxAge: maxAge, refresh: refresh, kick: make(chan struct{}, 1),
		outN: -1, changed: make(chan struct{})}
}

// get returns the watermark and the recorded outages.
func (w *watermark) get(ctx context.Context) (int64, []shard.Outage, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.read.IsZero() || time.Since(w.read) >= w.maxAge {
		if err := w.refreshLocked(ctx); err != nil {
			return 0, nil, err
		}
	}
	return w.wm, w.outages, nil
}

// wait returns a channel closed once a watermark later than wm is read, and
// keeps the refresher reading for a poll.
func (w *watermark) wait(wm int64) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wantUntil = time.Now().Add(w.maxAge)
	select {
	case w.kick <- struct{}{}:
	default:
	}
	if w.wm > wm {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return w.changed
}

// refreshLocked reads the watermark; the caller holds mu. The outages are
// read again only when the list changed: it only grows at its end (and is
// trimmed at its start), so its length and last entry say whether it did.
// Either read takes the watermark before the outages, in one round trip, and
// an outage is recorded before the watermark that jumped over it: a
// watermark is never paired with outages older than it.
func (w *watermark) refreshLocked(ctx context.Context) error {
	wm, n, last, err := w.store.WatermarkHead(ctx)
	if err != nil {
		return err
	}
	if n != w.outN || last != w.outLast {
		var outs []shard.Outage
		if wm, outs, err = w.store.Watermark(ctx); err != nil {
			return err
		}
		w.outages, w.outN, w.outLast = outs, n, last
	}
	w.read = time.Now()
	if wm > w.wm {
		w.wm = wm
		close(w.changed)
		w.changed = make(chan struct{})
	}
	return nil
}

// run reads the watermark every refresh while a loop waits for it to move,
// and sleeps otherwise, until ctx is done. Failures are left to the loops:
// get reads by itself once no read is fresh.
func (w *watermark) run(ctx context.Context) {
	t := time.NewTicker(w.refresh)
	defer t.Stop()
	for {
		w.mu.Lock()
		wanted := time.Now().Before(w.wantUntil)
		w.mu.Unlock()
		if !wanted {
			select {
			case <-ctx.Done():
				return
			case <-w.kick:
			}
		}
		w.mu.Lock()
		_ = w.refreshLocked(ctx)
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
