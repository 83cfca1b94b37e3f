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
		wait, err := s.step(ctx, i, l.lease)
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
		if wait > 0 && !sleep(ctx, l.stop, wait) {
			return
		}
	}
}

// sleep waits for d and reports whether the loop should go on.
func sleep(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	}
}

// step claims and handles one batch of shard i and returns how long to wait
// before the next claim.
func (s *Scanner) step(ctx context.Context, i int, lease shard.Lease) (time.Duration, error) {
	now := s.opts.Now()
	wm, outages, err := s.wm.get(ctx)
	if err != nil {
		return 0, fmt.Errorf("scanner: shard %d: %w", i, err)
	}
	if wm == 0 {
		// Ingest never ran: nothing is known to be silent.
		return s.opts.Poll, nil
	}
	s.m.watermarkLag.Set(float64(now.UnixMilli()-wm) / 1e3)
	horizon := min(now.UnixMilli(), wm)
	c, err := s.store.Claim(ctx, s.opts.Family, i, lease, horizon, s.opts.Batch)
	if err != nil {
		return 0, err
	}
	due := c.Due
	if len(due) == 0 {
		wait := s.opts.Poll
		if c.HasHead {
			// A head due by the clock but not by the watermark waits a poll.
			if d := time.UnixMilli(c.Head.Deadline).Sub(now); d > 0 && d < wait {
				wait = d
			}
		}
		return wait, nil
	}
	s.m.batchSize.Observe(float64(len(due)))

	// While a doubling drains, moved members are checked against their
	// partner shard first; stale copies are removed without firing.
	var stale []shard.Entry
	if prev, cur, ok := crossing(s.topo.Current(), c.Layout); ok {
		if due, stale, err = s.cross(ctx, i, prev, cur, due); err != nil {
			return 0, err
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
			return 0, err
		}
		s.m.deferred.Add(float64(st.Moved))
		s.m.revived.Add(float64(len(st.Revived)))
		if s.opts.Fire == nil {
			for _, r := range st.Revived {
				if err := s.recovered(ctx, r, fired[r.ID]); err != nil {
					return 0, err
				}
			}
		}
	}
	if fireErr != nil {
		// What was not published stays in the shard and is claimed again.
		return 0, fireErr
	}
	return 0, nil
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
	devs, err := s.store.Devices(ctx, ids)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("scanner: shard %d: %w", i, err)
	}
	firedAt := now.UnixMilli()
	fired = make(map[string]firedLost, len(due))
	msgs := make([]dispatch.Message, 0, len(due))
	sent := make([]shard.Entry, 0, len(due))
	for j, e := range due {
		typ := devs[j].Type
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

	marked := make([]error, len(acked))
	parallel(len(acked), func(j int) {
		marked[j] = s.store.MarkLost(ctx, acked[j].ID, acked[j].Deadline, firedAt)
	})
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

// watermarkCache shares one read of the ingest watermark among the shard
// loops; it is read again at most every poll interval.
type watermarkCache struct {
	store *shard.Store
	every time.Duration

	mu      sync.Mutex
	read    time.Time // when wm was read; real time, for rate-limiting only
	wm      int64
	outages []shard.Outage
}

func (c *watermarkCache) get(ctx context.Context) (int64, []shard.Outage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.read.IsZero() && time.Since(c.read) < c.every {
		return c.wm, c.outages, nil
	}
	wm, outages, err := c.store.Watermark(ctx)
	if err != nil {
		return 0, nil, err
	}
	c.read, c.wm, c.outages = time.Now(), wm, outages
	return wm, outages, nil
}
