package alarm

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
)

// Rate limits protect what consumes the notifications. Options.Rate caps
// the notifications of each type (as it appears in the subject) per
// second and Options.RateTotal those of all types, across every replica:
// the pace lives in Redis (shard.Store.ReserveSlots), where each note gets
// a send slot GCRA-style, one emission interval after the last of its type
// and of all. A note is published at its slot or later, never dropped:
// the device's timer wakes it at its slot. Slots are written into the
// device's state before anything is published, so a retry after a crash
// or a failed publish reuses its slot instead of taking another. Repeats of
// an alarm waiting for their slot are coalesced (machine.note).

// emission is the interval between two notifications at rate per second,
// rounded up to a whole millisecond so the rate is never exceeded (0:
// unlimited).
func emission(rate float64) time.Duration {
	if rate <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(1000/rate)) * time.Millisecond
}

// limited reports whether notifications are paced.
func (a *Alarms) limited() bool { return a.opts.Rate > 0 || a.opts.RateTotal > 0 }

// coalesced counts the notes of old that next no longer holds: within a
// transition only a coalesced repeat leaves.
func coalesced(old, next []Note) int {
	n := 0
	for _, o := range old {
		if !slices.ContainsFunc(next, func(x Note) bool { return x.ID == o.ID }) {
			n++
		}
	}
	return n
}

// reserve gives every pending note of st that has no send slot (and is
// not muted) one, and writes them with a compare-and-set before anything
// is published. The timer is armed for the earliest slot still to come
// before the state is written. It returns the state in force afterwards,
// and false when another transition came first: its state is returned
// (the slots reserved are left unused, a gap in the pace, never an excess).
func (a *Alarms) reserve(ctx context.Context, id string, st stored, now time.Time) (stored, bool, error) {
	if !a.limited() {
		return st, true, nil
	}
	var types []string
	var idx []int
	for j, n := range st.Pending {
		if n.Slot == 0 && !n.Muted {
			types = append(types, dispatch.SanitizeType(n.Type))
			idx = append(idx, j)
		}
	}
	if len(idx) == 0 {
		return st, true, nil
	}
	ms := now.UnixMilli()
	slots, err := a.store.ReserveSlots(ctx, ms, types, emission(a.opts.Rate), emission(a.opts.RateTotal))
	if err != nil {
		return st, false, fmt.Errorf("alarm: pace notifications of %s: %w", id, err)
	}
	next := st.State
	next.Pending = slices.Clone(st.Pending)
	later := false
	for k, j := range idx {
		next.Pending[j].Slot = slots[k]
		later = later || slots[k] > ms
	}
	if later {
		if err := a.arm(ctx, id, next.wake(ms, pendingRetry), now); err != nil {
			return st, false, err
		}
	}
	cur, ok, err := a.cas(ctx, id, st, next)
	if err != nil {
		return st, false, err
	}
	if !ok {
		won, err := a.load(ctx, id)
		if err != nil {
			return st, false, err
		}
		if later {
			// The arming may have moved a timer the winner's state needs.
			if err := a.restore(ctx, id, won.wake(ms, pendingRetry)); err != nil {
				return won, false, err
			}
		}
		return won, false, nil
	}
	for k, j := range idx {
		n := next.Pending[j]
		if slots[k] > ms {
			a.m.delayed.WithLabelValues(types[k]).Inc()
		}
		a.m.delay.Observe(float64(max(slots[k]-n.At, 0)) / 1e3)
	}
	return cur, true, nil
}
