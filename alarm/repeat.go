package alarm

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
)

// repeats is the repeat timers' queue.Handler.
type repeats struct{ a *Alarms }

var (
	_ queue.Handler = repeats{}
	_ queue.Fencer  = repeats{}
)

// fenceScope names the repeat timers' shard fences in the stream.
const fenceScope = "repeats"

// Fence fences the notifications of a repeat timer shard whose lease this
// replica has just taken (see dispatch.Fence).
func (r repeats) Fence(ctx context.Context, l shard.Lease) (uint64, error) {
	f, err := r.a.pub.Fence(ctx, fenceScope, l.Shard, r.a.opts.Replica, l.Token())
	return f.Seq, err
}

// Fire wakes the alarm of each due timer of b.Shard. A timer is only a
// wake-up call; the device's state says what is due (a repeat, the end of
// an ack or of flapping, a pending notification) and when the timer must
// fire next. A timer that fires early is moved to that time, one whose
// alarm has nothing left to do is removed, and one that could not be
// handled stays and is claimed again (the engine backs off).
func (r repeats) Fire(ctx context.Context, b queue.Batch) (handled []shard.Entry, moves []shard.Move, err error) {
	a, i, due, now := r.a, b.Shard, b.Due, b.Now
	type fate struct {
		remove bool
		move   int64
	}
	fates := make([]fate, len(due))
	fence := a.pub.FenceOf(fenceScope, i, b.Fence)
	var fenced atomic.Bool
	var g errgroup.Group
	g.SetLimit(a.opts.Workers)
	for j, e := range due {
		g.Go(func() error {
			remove, move, err := a.wake(ctx, i, e, now, fence)
			if errors.Is(err, dispatch.ErrFenced) {
				fenced.Store(true)
				return nil
			}
			if err != nil {
				if ctx.Err() == nil {
					a.log.Warn("repeat timer not handled; retried", "device", e.ID, "err", err)
				}
				return nil
			}
			fates[j] = fate{remove: remove, move: move}
			return nil
		})
	}
	_ = g.Wait()
	if fenced.Load() {
		// Another replica has the shard: nothing of the batch is settled.
		return nil, nil, fmt.Errorf("alarm: repeat timers of shard %d: %w", i, queue.ErrFenced)
	}
	for j, f := range fates {
		switch {
		case f.remove:
			handled = append(handled, due[j])
		case f.move > 0:
			moves = append(moves, shard.Move{ID: due[j].ID, From: due[j].Deadline, To: f.move})
		}
	}
	return handled, moves, nil
}

// Fired reports no fire: what a wake does is decided by the device's alarm
// state, which each transition changes with a compare-and-set, so waking
// an alarm from a stale copy of its timer does nothing twice.
func (repeats) Fired(_ context.Context, ids []string) ([]int64, error) {
	return make([]int64, len(ids)), nil
}

// Revived needs nothing: a timer re-armed between claim and settle stays
// as armed.
func (repeats) Revived(context.Context, shard.Entry, shard.Entry) error { return nil }

// wake handles one due timer e of shard i and says what becomes of it:
// removed, or moved to move. Both are compare-and-set on its claimed score,
// so a timer a transition re-armed meanwhile stays as armed.
func (a *Alarms) wake(ctx context.Context, i int, e shard.Entry, now time.Time, fence dispatch.Fence) (remove bool, move int64, err error) {
	id := e.ID
	if sc, ok := scopeOf(id); ok {
		// A scope's timer first carries out its storm's transitions.
		if err := a.flushStorm(ctx, sc, fence); err != nil {
			return false, 0, err
		}
	}
	cur, err := a.current(ctx, id)
	if err != nil {
		return false, 0, err
	}
	var dueAt int64
	var held bool
	st, err := a.transition(ctx, id, now, func(st *State) (bool, error) {
		// The storms over a device hold its alarm; they are cached, so
		// a retried transition costs no more reads.
		var sm storm
		if _, scope := scopeOf(id); !scope && st.Phase == Active {
			var err error
			if sm, err = a.stormOver(ctx, st.Group); err != nil {
				return false, err
			}
		}
		var changed bool
		changed, dueAt, held = a.deviceMachine(id, st.Type, now).wake(st, cur, sm)
		return changed, nil
	})
	if err != nil {
		return false, 0, err
	}
	if held {
		a.m.held.Inc()
	}
	if dueAt > 0 {
		a.m.repeatLag.Observe(float64(now.UnixMilli()-dueAt) / 1e3)
	}
	if st, err = a.flush(ctx, id, st, fence); err != nil {
		return false, 0, err
	}
	w := st.wake(now.UnixMilli(), pendingRetry)
	switch home := shard.Of(id, a.rtopo.Current().Shards); {
	case w == 0:
		return true, 0, nil
	case i != home:
		// A copy outside the device's shard (left by a doubling, or by a
		// writer that had not seen it yet) is moved home.
		if err := a.restore(ctx, id, w); err != nil {
			return false, 0, err
		}
		return true, 0, nil
	case w > e.Deadline:
		return false, w, nil
	}
	// Due by the state but nothing done: try again shortly rather than at
	// once.
	return false, now.Add(pendingRetry).UnixMilli(), nil
}
