package alarm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// stored is a State and the exact value it was read from, which the
// compare-and-set compares against. A State is stored as JSON in shard's
// per-device state, beside the registry.
type stored struct {
	State
	raw string
}

// load reads id's alarm state; a device never alarmed has the zero State.
func (a *Alarms) load(ctx context.Context, id string) (stored, error) {
	v, err := a.store.State(ctx, id)
	if err != nil {
		return stored{}, fmt.Errorf("alarm: read state of %s: %w", id, err)
	}
	if v == "" {
		return stored{}, nil
	}
	var st State
	if err := json.Unmarshal([]byte(v), &st); err != nil {
		return stored{}, fmt.Errorf("alarm: state of %s is corrupt (%q): %w", id, v, err)
	}
	return stored{State: st, raw: v}, nil
}

// cas writes next over old and reports whether old was still current.
func (a *Alarms) cas(ctx context.Context, id string, old stored, next State) (stored, bool, error) {
	next.Version = old.Version + 1
	b, err := json.Marshal(next)
	if err != nil {
		return stored{}, false, fmt.Errorf("alarm: encode state of %s: %w", id, err)
	}
	ok, err := a.store.CompareAndSwapState(ctx, id, old.raw, string(b), next.Phase != Idle)
	if err != nil {
		return stored{}, false, fmt.Errorf("alarm: write state of %s: %w", id, err)
	}
	if ok {
		a.remember(ctx, id, next.Version, string(b))
	}
	return stored{State: next, raw: string(b)}, ok, nil
}

// remember queues a written state for the durable registry, which keeps it
// unless it holds a later one.
func (a *Alarms) remember(ctx context.Context, id string, version int64, raw string) {
	if a.opts.Registry == nil {
		return
	}
	a.opts.Registry.Later(ctx, id, func(r *dispatch.DeviceRecord, exists bool) (bool, bool) {
		// A device the registry does not know (removed) gets no record
		// from its alarm: it is not to be watched again.
		if !exists || r.Alarm != "" && stateVersion(r.Alarm) >= version {
			return false, false
		}
		r.Alarm = raw
		return true, false
	})
}

// stateVersion reads the version of a raw state (0 if it does not parse).
func stateVersion(raw string) int64 {
	var v struct {
		Version int64 `json:"v"`
	}
	_ = json.Unmarshal([]byte(raw), &v)
	return v.Version
}

// PutBack writes raw, a state the durable registry kept, as id's alarm
// state unless Redis holds a later one, and arms the timer it waits for:
// after Redis lost data, an active alarm goes on repeating where it was.
func (a *Alarms) PutBack(ctx context.Context, id, raw string) error {
	var st State
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return fmt.Errorf("alarm: kept state of %s is corrupt (%q): %w", id, raw, err)
	}
	for attempt := 0; attempt < casAttempts; attempt++ {
		old, err := a.load(ctx, id)
		if err != nil {
			return err
		}
		if old.raw != "" && old.Version >= st.Version {
			return nil
		}
		ok, err := a.store.CompareAndSwapState(ctx, id, old.raw, raw, st.Phase != Idle)
		if err != nil {
			return fmt.Errorf("alarm: write state of %s: %w", id, err)
		}
		if ok {
			return a.restore(ctx, id, st.wake(a.opts.Now().UnixMilli(), pendingRetry))
		}
	}
	return errContended
}

// current returns id's current deadline: the later of its scores in its
// shard and, while a doubling drains, its shard before (0: not watched).
func (a *Alarms) current(ctx context.Context, id string) (int64, error) {
	var best int64
	for _, i := range a.topo.Current().Locate(id) {
		d, ok, err := a.store.Score(ctx, shard.Deadlines, i, id)
		if err != nil {
			return 0, fmt.Errorf("alarm: deadline of %s: %w", id, err)
		}
		if ok && d > best {
			best = d
		}
	}
	return best, nil
}

// armSkew is how far the clocks of two sigwatch processes may disagree: a
// timer scored up to this far ahead of our clock may already be claimed by
// another process's engine, so arming changes its score rather than keep
// it. Every process runs on Redis server time (internal/clock), so they
// disagree by the clocks' uncertainties (half a round trip to Redis each,
// logged above a quarter of this bound) plus drift between refreshes: far
// less than this, whatever the hosts' own clocks say.
const armSkew = time.Second

// arm makes id's repeat timer fire no later than at, before a transition
// that needs it is written. The copy in the device's shard is lowered to at
// or created; while a doubling of the timers drains, a copy left in the
// device's old shard is lowered too (it is never created there), so that
// the later of the two, which is the one that fires, is not later than at.
// A timer a scanner may be handling gets a new score, so the scanner
// neither removes nor moves it. Arming never makes a timer later than a
// state needs except by replacing one that is due now.
func (a *Alarms) arm(ctx context.Context, id string, at int64, now time.Time) error {
	horizon := now.Add(armSkew).UnixMilli()
	for j, i := range a.rtopo.Current().Locate(id) {
		if _, _, err := a.timers.Arm(ctx, shard.Repeats, i, id, at, horizon, j == 0); err != nil {
			return fmt.Errorf("alarm: arm timer of %s: %w", id, err)
		}
	}
	return nil
}

// restore lowers id's timer to at (creating it if absent) after a
// transition that armed it lost its compare-and-set: the arming may have
// replaced an earlier timer the winner's state needs.
func (a *Alarms) restore(ctx context.Context, id string, at int64) error {
	if at <= 0 {
		return nil
	}
	i := shard.Of(id, a.rtopo.Current().Shards)
	if _, _, err := a.timers.Arm(ctx, shard.Repeats, i, id, at, 0, true); err != nil {
		return fmt.Errorf("alarm: restore timer of %s: %w", id, err)
	}
	return nil
}

// errContended is returned when a device's state kept changing under a
// transition; the caller retries later.
var errContended = errors.New("alarm: state changed under every attempt")

// casAttempts bounds the compare-and-set retries of one transition.
const casAttempts = 16

// transition applies decide to id's state with compare-and-set until it
// sticks, and returns the state in force afterwards. decide changes the
// state it is given and reports whether it did; it may run several times.
// Notes decide adds are muted, inside the transition, if a mute covers them.
// The timer is armed for the new state before the state is written, so a
// written state never waits for a timer that is not there.
func (a *Alarms) transition(ctx context.Context, id string, now time.Time, decide func(st *State) (bool, error)) (stored, error) {
	armed := false
	for attempt := 0; attempt < casAttempts; attempt++ {
		old, err := a.load(ctx, id)
		if err != nil {
			return stored{}, err
		}
		next := old.State
		next.Losses = append([]int64(nil), old.Losses...)
		next.Pending = append([]Note(nil), old.Pending...)
		changed, err := decide(&next)
		if err != nil {
			return stored{}, err
		}
		if !changed {
			if armed {
				if err := a.restore(ctx, id, old.wake(now.UnixMilli(), pendingRetry)); err != nil {
					return stored{}, err
				}
			}
			return old, nil
		}
		// decide appends notes; a repeat it coalesced leaves its place for
		// the one appended.
		gone := coalesced(old.Pending, next.Pending)
		if k := len(old.Pending) - gone; len(next.Pending) > k {
			if err := a.mute(ctx, next.Pending[k:], now); err != nil {
				return stored{}, err
			}
		}
		slotted, err := a.slots(ctx, id, &next, now.UnixMilli())
		if err != nil {
			return stored{}, err
		}
		next.At = now.UnixMilli()
		if w := next.wake(now.UnixMilli(), pendingRetry); w > 0 {
			if err := a.arm(ctx, id, w, now); err != nil {
				return stored{}, err
			}
			armed = true
		}
		cur, ok, err := a.cas(ctx, id, old, next)
		if err != nil {
			return stored{}, err
		}
		if ok {
			a.m.coalesced.Add(float64(gone))
			a.counted(slotted, now.UnixMilli())
			return cur, nil
		}
	}
	return stored{}, fmt.Errorf("%w: %s", errContended, id)
}

// pendingRetry is when a notification that could not be published is tried
// again by the device's timer.
const pendingRetry = 2 * time.Second
