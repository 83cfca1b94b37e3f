package timer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/periodic"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
)

// fire is the generic timers' queue.Handler: a due timer is one event on
// sigwatch.timer.<queue>, and nothing else.
type fire struct{ svc *Service }

var (
	_ queue.Handler = (*fire)(nil)
	_ queue.Fencer  = (*fire)(nil)
)

// Fence fences the timer events of a shard whose lease this replica has
// just taken (see dispatch.Fence).
func (h *fire) Fence(ctx context.Context, l shard.Lease) (uint64, error) {
	f, err := h.svc.pub.Fence(ctx, family, l.Shard, h.svc.opts.Replica, l.Token())
	return f.Seq, err
}

// Fire publishes one event per due timer, with its payload, under the
// shard's fence, and returns the timers published. While a doubling
// drains, each published one is then marked fired for the crossing rule.
func (h *fire) Fire(ctx context.Context, b queue.Batch) (handled []shard.Entry, moves []shard.Move, err error) {
	s := h.svc
	payloads, changed, err := s.fires.Timers().FiringPayloads(ctx, b.Shard, b.Due)
	if err != nil {
		return nil, nil, fmt.Errorf("timer: shard %d: %w", b.Shard, err)
	}
	if s.opts.firing != nil {
		s.opts.firing()
	}
	firedAt := b.Now.UnixMilli()
	msgs := make([]dispatch.Message, 0, len(b.Due))
	sent := make([]shard.Entry, 0, len(b.Due))
	for j, e := range b.Due {
		if changed[j] {
			// Reset since the claim: not fired now, and left where it is
			// (a move to where it was claimed changes nothing if it moved,
			// and keeps it if it came back), to be claimed again.
			moves = append(moves, shard.Move{ID: e.ID, From: e.Deadline, To: e.Deadline})
			continue
		}
		q, id, ok := shard.SplitTimerMember(e.ID)
		if !ok || CheckQueue(q) != nil {
			// Not a member any writer of sigwatch writes: dropped, said once.
			s.log.Warn("malformed timer member removed", "member", e.ID)
			handled = append(handled, e)
			continue
		}
		ev := dispatch.Timer{ID: dispatch.TimerID(q, id, e.Deadline), Queue: q, Timer: id,
			Deadline: e.Deadline, FiredAt: firedAt, Payload: payloads[j]}
		msg, err := dispatch.Encode(s.pub.Subjects(), ev)
		if err != nil {
			return nil, nil, fmt.Errorf("timer: encode event: %w", err)
		}
		msgs, sent = append(msgs, msg), append(sent, e)
	}
	errs := s.pub.PublishFenced(ctx, s.pub.FenceOf(family, b.Shard, b.Fence), msgs)
	published := make([]shard.Entry, 0, len(sent))
	for j, e := range sent {
		switch {
		case errs[j] == nil:
			published = append(published, e)
		case errors.Is(errs[j], dispatch.ErrFenced):
			return nil, nil, fmt.Errorf("timer: shard %d: %w: %w", b.Shard, queue.ErrFenced, errs[j])
		default:
			s.m.publishErrors.Inc()
			if err == nil {
				err = fmt.Errorf("timer: shard %d: %w", b.Shard, errs[j])
			}
		}
	}
	if b.Moving && len(published) > 0 {
		// While a doubling drains, a timer is marked fired after its event
		// is stored and before its copy is removed, for the crossing rule.
		// Marked earlier, a publish that failed would leave a mark that
		// makes the retry of the same copy look fired elsewhere. The marks
		// live beside the registry, where the lease cannot fence them: a
		// replica resumed from a long pause writes none.
		if !b.Held() {
			return nil, nil, fmt.Errorf("timer: shard %d: lease ran out before marking: %w", b.Shard, queue.ErrFenced)
		}
		if merr := s.fires.Timers().MarkFired(ctx, published); merr != nil {
			// Not removed: claimed and published again, which
			// de-duplication drops, and marked then.
			return handled, moves, fmt.Errorf("timer: shard %d: %w", b.Shard, merr)
		}
	}
	for _, e := range published {
		handled = append(handled, e)
		s.m.fired.Inc()
		s.m.lag.Observe(float64(firedAt-e.Deadline) / 1e3)
	}
	return handled, moves, err
}

// Fired returns the deadline each timer last fired at while a doubling
// drained: a timer is marked once its event is stored, before its copy is
// removed.
func (h *fire) Fired(ctx context.Context, ids []string) ([]int64, error) {
	return h.svc.fires.Timers().Fired(ctx, ids)
}

// Revived needs nothing: a reset that landed after its timer was claimed
// due starts the timer anew, and it fires again at its new deadline.
func (*fire) Revived(context.Context, shard.Entry, shard.Entry) error { return nil }

// watermarkEvery is how often a replica advances the timers' watermark
// while one of its loops waits for it, watermarkIdle how often otherwise.
const (
	watermarkEvery = 2 * time.Millisecond
	watermarkIdle  = 500 * time.Millisecond
)

// ClockMargin is how far the NATS server's clock may be ahead of
// sigwatch's: while resets wait in the stream, timers fire only up to the
// oldest one's publication less this margin.
const ClockMargin = 250 * time.Millisecond

// advanceWatermark moves the timers' watermark forward: to now when no
// reset waits in the stream (or the NATS path is off), else to just before
// the oldest waiting reset was published. Timers fire only up to it, so a
// reset published before a deadline is stored before the timer can fire.
// While the stream cannot be read, the watermark stands still and timers
// wait. A replica does it every watermarkEvery while a timer is due and
// waits for it (its own engine, or any replica's, which asks through
// shard.Store.WantWatermark), and every watermarkIdle otherwise: an idle
// installation reads the stream twice a second per replica.
func (s *Service) advanceWatermark(ctx context.Context) error {
	var fastUntil atomic.Int64
	asked := make(chan struct{}, 1)
	var wants sync.WaitGroup
	defer wants.Wait()
	wantsCtx, stop := context.WithCancel(ctx)
	defer stop()
	wants.Go(func() {
		s.wm.Watermarks().Wants(wantsCtx, nil, func() {
			fastUntil.Store(time.Now().Add(wantHold).UnixNano())
			select {
			case asked <- struct{}{}:
			default:
			}
		})
	})
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-asked:
		}
		now := s.opts.Now()
		wm := now
		ok := true
		if s.opts.NATS {
			n, oldest, err := s.pub.TimerBacklog(ctx)
			switch {
			case errors.Is(err, dispatch.ErrNoTimerStream):
			case err != nil:
				ok = false
				s.warnOnce("timer reset stream not readable; timers wait", err)
			case n > 0:
				if o := oldest.Add(-ClockMargin); o.Before(now) {
					wm = o
				}
				s.m.backlog.Set(float64(n))
			default:
				s.m.backlog.Set(0)
			}
		}
		if ok {
			if _, err := s.wm.Watermarks().Advance(ctx, wm.UnixMilli(), noOutages); err != nil && ctx.Err() == nil {
				s.warnOnce("timer watermark not advanced", err)
			}
		}
		next := watermarkIdle
		if s.eng.WatermarkWanted() || time.Now().UnixNano() < fastUntil.Load() {
			next = watermarkEvery
		}
		t.Reset(next)
	}
}

// wantHold is how long an ask for the timers' watermark keeps the
// advancer at its full rate (a waiting engine asks every 100ms).
const wantHold = time.Second

// noOutages is the outage threshold of the timers' watermark: timers have
// no outage rule, so no gap is recorded.
const noOutages = 100 * 365 * 24 * time.Hour

func (s *Service) warnOnce(msg string, err error) {
	s.m.warn.Warn(s.log, msg, msg, "err", err)
}

// moveEvery is the period at which the owner of an old shard carries its
// moved timers that are not due soon to their new shard while a doubling
// drains; moveAhead is how far ahead a timer must be to be carried (one
// due sooner fires from where it is).
const (
	moveEvery = 2 * time.Second
	moveAhead = 30 * time.Second
	moveMax   = 100_000
)

// moveLongTimers lets a doubling drain without waiting for the moved
// timers of the old shards this replica owns to fall due, which may be
// days away: every moveEvery it carries them to their new shard.
func (s *Service) moveLongTimers(ctx context.Context) error {
	periodic.Run(ctx, moveEvery, func(time.Time) {
		top := s.topo.Current()
		if !top.Draining() {
			return
		}
		for _, i := range s.eng.Owned() {
			if i >= top.Prev {
				continue
			}
			members, err := s.fires.Timers().Moved(ctx, i, top.Shards, moveMax)
			for len(members) > 0 && err == nil {
				chunk := members[:min(len(members), 1000)]
				members = members[len(chunk):]
				err = s.writer.MoveTimers(ctx, chunk, s.opts.Now().Add(moveAhead).UnixMilli())
			}
			if err != nil && ctx.Err() == nil {
				s.warnOnce("moved timers not carried; retrying", err)
			}
		}
	})
	return nil
}
