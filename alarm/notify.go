package alarm

import (
	"context"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
)

// flush publishes the pending notes of st that are due (muted ones are
// dropped), then clears them from the state with a compare-and-set, and
// returns the state in force afterwards. Under rate limits a note is due
// at its send slot, which is reserved and stored first (see rate.go); a
// note waiting for its slot stays pending and the device's timer wakes it
// then. A note is cleared only after JetStream acknowledged it; publishing
// it again, after a crash or by a racing replica, carries the same
// Nats-Msg-Id and is dropped by JetStream. When publishing fails the notes
// stay pending and the device's timer (or the event's redelivery) tries
// again. A repeat timer's wake publishes under its shard's fence, so that a
// replica that lost the shard publishes nothing; the event and API paths
// under a lapsing fence taken before the state was read (fences.go), so
// that a replica paused past it publishes nothing.
func (a *Alarms) flush(ctx context.Context, id string, st stored, fence dispatch.Fence) (stored, error) {
	for attempt := 0; attempt < casAttempts; attempt++ {
		if len(st.Pending) == 0 {
			return st, nil
		}
		now := a.opts.Now()
		var ok bool
		var err error
		if st, ok, err = a.reserve(ctx, id, st, now); err != nil {
			return st, err
		} else if !ok {
			continue
		}
		ms := now.UnixMilli()
		var msgs []dispatch.Message
		var notes, keep []Note
		for _, n := range st.Pending {
			switch {
			case n.Slot > ms:
				keep = append(keep, n)
				continue
			case n.Muted:
				continue
			}
			msg, err := dispatch.Encode(a.pub.Subjects(), n.Alarm)
			if err != nil {
				return st, fmt.Errorf("alarm: encode notification: %w", err)
			}
			msgs = append(msgs, msg)
			notes = append(notes, n)
		}
		if len(keep) == len(st.Pending) {
			return st, nil // every note waits for its slot
		}
		// What is announced is in the registry first.
		if len(msgs) > 0 {
			if err := a.persist(ctx, id, st); err != nil {
				return st, fmt.Errorf("alarm: keep the state of %s before notifying: %w", id, err)
			}
		}
		for j, err := range a.pub.PublishFenced(ctx, fence, msgs) {
			if err != nil {
				a.m.publishErrors.Inc()
				return st, fmt.Errorf("alarm: notify %s: %w", notes[j].ID, err)
			}
		}
		acked := a.opts.Now().UnixMilli()
		for _, n := range notes {
			if n.Slot > 0 {
				a.m.lateness.Observe(float64(max(acked-n.Slot, 0)) / 1e3)
			}
		}
		next := st.State
		next.Pending = keep
		cur, ok, err := a.cas(ctx, id, st, next)
		if err != nil {
			return st, err
		}
		if ok {
			for _, n := range st.Pending {
				if n.Slot <= ms {
					a.m.notified(n)
				}
			}
			return cur, nil
		}
		// Someone changed the state meanwhile; what it still holds pending
		// is published again (de-duplicated) and cleared.
		if st, err = a.load(ctx, id); err != nil {
			return st, err
		}
	}
	return st, fmt.Errorf("%w: %s", errContended, id)
}

// apply runs a transition and publishes what it decided under fence,
// taken before the transition.
func (a *Alarms) apply(ctx context.Context, id string, now time.Time, fence dispatch.Fence, decide func(st *State) (bool, error)) (stored, error) {
	st, err := a.transition(ctx, id, now, decide)
	if err != nil {
		return st, err
	}
	a.beforeNotify(st)
	return a.flush(ctx, id, st, fence)
}
