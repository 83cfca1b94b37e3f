package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sigwatch/sigwatch/internal/backoff"
	"github.com/sigwatch/sigwatch/shard"
)

// shardLoop is the state of one held lease and the loop that scans it.
type shardLoop struct {
	lease    shard.Lease
	fence    uint64        // from Options.Fencer, set before the first claim
	stop     chan struct{} // closed to ask for a stop after the in-flight batch
	stopOnce sync.Once
	// woke ends the loop's sleep: a write landed earlier than the time the
	// loop recorded in its wake key, or the wake subscription was
	// (re)established (see shard.Store.Wakes).
	woke   chan struct{}
	cancel context.CancelFunc // the hard stop, when the lease is lost
	lost   atomic.Bool
	// until is the local (monotonic) time before which the lease surely
	// holds: the send time of its last acquisition or renewal plus the
	// lease time, since Redis starts the lease's clock no earlier.
	until atomic.Pointer[time.Time]
}

// extend records that the lease was acquired or renewed by a call sent at
// sent.
func (l *shardLoop) extend(sent time.Time, ttl time.Duration) {
	u := sent.Add(ttl)
	l.until.Store(&u)
}

// held reports whether the lease surely still holds.
func (l *shardLoop) held() bool {
	u := l.until.Load()
	return u != nil && time.Now().Before(*u)
}

func (l *shardLoop) requestStop() { l.stopOnce.Do(func() { close(l.stop) }) }

// wake ends the loop's current or next sleep.
func (l *shardLoop) wake() {
	select {
	case l.woke <- struct{}{}:
	default:
	}
}

// releaseTimeout bounds the release of a lease after its loop has ended.
const releaseTimeout = 2 * time.Second

// runShard scans one shard until it is asked to stop, its lease is lost or
// ctx is cancelled, then releases the lease if it still holds it.
func (e *Engine) runShard(ctx context.Context, l *shardLoop) {
	i := l.lease.Shard
	defer func() {
		if l.lost.Load() || e.killed() {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if err := e.store.Release(rctx, l.lease); err != nil {
			e.log.Warn("lease release failed; it expires by itself", "shard", i, "err", err)
		}
		e.log.Debug("shard released", "shard", i)
	}()
	bo := backoff.Backoff{Policy: stepBackoff}
	if !e.fence(ctx, l, &bo) {
		return
	}
	for {
		select {
		case <-l.stop:
			return
		case <-ctx.Done():
			return
		case <-l.woke: // the claim below sees what the notice was about
		default:
		}
		wait, wm, err := e.step(ctx, i, l)
		switch {
		case errors.Is(err, shard.ErrNotOwner):
			e.leaseLost(l, "scan")
			return
		case errors.Is(err, ErrFenced):
			// Another replica fenced the shard, or the stream dropped the
			// fence (its limits). The lease is released if still held, so
			// that whoever takes it next fences anew.
			e.m.leaseLost.Inc()
			e.log.Warn("shard fenced out; stopping its loop", "shard", i, "err", err)
			return
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			e.warn.Warn(e.log, fmt.Sprint("shard", i), "scan failed; retrying", "shard", i, "err", err)
			wait = bo.Next()
		default:
			bo.Reset()
		}
		if wait > 0 && !sleepOrWake(ctx, l.stop, wait, wm, l.woke) {
			return
		}
	}
}

// fence runs the Fencer for l's fresh lease, retrying until it succeeds,
// and reports whether the loop may go on.
func (e *Engine) fence(ctx context.Context, l *shardLoop, bo *backoff.Backoff) bool {
	if e.opts.Fencer == nil {
		return true
	}
	for {
		fctx, cancel := context.WithTimeout(ctx, e.opts.LeaseTTL)
		f, err := e.opts.Fencer.Fence(fctx, l.lease)
		cancel()
		if err == nil {
			l.fence = f
			bo.Reset()
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		e.warn.Warn(e.log, fmt.Sprint("fence", l.lease.Shard), "fencing the shard failed; retrying", "shard", l.lease.Shard, "err", err)
		if !sleepOrWake(ctx, l.stop, bo.Next(), nil, nil) {
			return false
		}
	}
}

// sleepOrWake waits for d, or until wm is closed or woke receives, and
// reports whether the loop should go on.
func sleepOrWake(ctx context.Context, stop <-chan struct{}, d time.Duration, wm <-chan struct{}, woke <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-wm:
		return true
	case <-woke:
		return true
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	}
}

// step claims and handles one batch of shard i and returns how long to wait
// before the next claim, and a channel that ends the wait early: closed
// when the watermark moves, if what is due waits only for it. With nothing
// due the loop sleeps until its head is due, at most a poll; a write that
// lands earlier wakes it (shard.Store.Wakes).
//
// The order is the one every invariant rests on: claim (fenced, bounded by
// the clock and the watermark) → crossing rule → the handler fires → settle
// (fenced compare-and-remove of what it handled and of stale copies, moves
// applied if unchanged) → the handler is told of fired entries a reset
// revived meanwhile, in this shard or, for a moved device, in its partner.
func (e *Engine) step(ctx context.Context, i int, l *shardLoop) (time.Duration, <-chan struct{}, error) {
	lease := l.lease
	now := e.opts.Now()
	wm, outages, err := e.wm.get(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("queue: shard %d: %w", i, err)
	}
	if wm == 0 {
		// Ingest never ran: nothing is known to be silent. Look again once
		// it has.
		return e.wm.bound(), e.wm.wait(wm), nil
	}
	e.m.watermarkLag.Set(float64(now.UnixMilli()-wm) / 1e3)
	horizon := min(now.UnixMilli(), wm)
	c, err := e.store.Claim(ctx, e.opts.Family, i, lease, horizon, e.opts.Batch, now.Add(e.opts.Poll))
	if err != nil {
		return 0, nil, err
	}
	e.m.claims.Inc()
	due := c.Due
	if len(due) == 0 {
		wait := e.opts.Poll
		if c.HasHead {
			d := time.UnixMilli(c.Head.Deadline).Sub(now)
			if d <= 0 {
				// Due by the clock but not by the watermark: claim again as
				// soon as a later watermark is read.
				return e.wm.bound(), e.wm.wait(wm), nil
			}
			wait = min(wait, d)
		}
		return wait, nil, nil
	}
	e.m.batchSize.Observe(float64(len(due)))

	// While a doubling drains, moved members are checked against their
	// partner shard first; stale copies are removed without firing.
	var stale []shard.Entry
	prev, cur, moving := crossing(e.topo.Current(), c.Layout)
	if moving {
		if due, stale, err = e.cross(ctx, i, prev, cur, due); err != nil {
			return 0, nil, err
		}
	}

	var (
		handled []shard.Entry
		moves   []shard.Move
		fireErr error
	)
	if len(due) > 0 {
		handled, moves, fireErr = e.h.Fire(ctx, Batch{Shard: i, Due: due, Now: now, Outages: outages, Fence: l.fence, Moving: moving, held: l.held})
		if errors.Is(fireErr, ErrFenced) {
			// Nothing of a fenced-out batch is settled: the new owner has it.
			return 0, nil, fireErr
		}
		if left := len(due) - len(handled) - len(moves); left > 0 && fireErr == nil {
			// Back off rather than claim the same entries again at once.
			fireErr = fmt.Errorf("queue: shard %d: %d of %d due entries not handled; retrying", i, left, len(due))
		}
	}
	if e.opts.AfterFire != nil {
		e.opts.AfterFire(i)
	}
	if len(handled)+len(stale)+len(moves) > 0 {
		st, err := e.store.Settle(ctx, e.opts.Family, i, lease, append(handled[:len(handled):len(handled)], stale...), moves)
		if err != nil {
			return 0, nil, err
		}
		e.m.deferred.Add(float64(st.Moved))
		e.m.revived.Add(float64(len(st.Revived)))
		if err := e.revived(ctx, handled, st.Revived); err != nil {
			return 0, nil, err
		}
		if moving {
			if err := e.revivedElsewhere(ctx, i, prev, cur, handled); err != nil {
				return 0, nil, err
			}
		}
	}
	if fireErr != nil {
		// What was not handled stays in the shard and is claimed again.
		return 0, nil, fireErr
	}
	return 0, nil, nil
}

// revived tells the handler of each entry it handled that a reset revived
// between claim and settle. Stale copies the crossing rule removed were
// never fired, so the handler hears nothing of them.
func (e *Engine) revived(ctx context.Context, handled, revived []shard.Entry) error {
	if len(revived) == 0 {
		return nil
	}
	fired := make(map[string]shard.Entry, len(handled))
	for _, f := range handled {
		fired[f.ID] = f
	}
	for _, r := range revived {
		f, ok := fired[r.ID]
		if !ok {
			continue
		}
		if err := e.h.Revived(ctx, f, r); err != nil {
			return err
		}
	}
	return nil
}

// stepBackoff is the wait after a failed step: 50ms doubling up to 2s.
var stepBackoff = backoff.Policy{Base: 50 * time.Millisecond, Max: 2 * time.Second}
