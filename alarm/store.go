package alarm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// Each device's alarm state is a JSON value in the HASH named statesLeaf
// of its registry partition, beside its registry entry; the open ones are
// also in the partition's open index (index.go). Every change is one
// compare-and-set (swap).

// statesLeaf and openLeaf name the partition HASHes of the states and of
// the open index (id -> state).
const (
	statesLeaf = "alarm"
	openLeaf   = "open"
)

// stored is a State and the exact value it was read from, which the
// compare-and-set compares against.
type stored struct {
	State
	raw string
}

// load reads id's alarm state; a device never alarmed has the zero State.
func (a *Alarms) load(ctx context.Context, id string) (stored, error) {
	r := a.store.Do(ctx, "HGET", []string{a.store.Keys().InPart(id, statesLeaf)}, id)
	if r.IsNil() {
		return stored{}, nil
	}
	v, err := r.ToString()
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

// swap is one compare-and-set: key (field of it, if a HASH) is to change
// from old ("" for none) to next, and, with an index, the index entry of
// field to follow (open: set to next, else removed).
type swap struct {
	key, field, old, next string
	index                 string
	open                  bool
}

// swapScript is every compare-and-set of the alarm's data: it replaces one
// value only if it is still the value the caller read, and keeps the
// value's index entry in step.
//
// KEYS[1]: the value: a STRING, or a HASH when ARGV[1] names a field
// KEYS[2]: the index HASH (field -> value), if any
// ARGV[1]: the field ("" for a STRING); ARGV[2]: the value read ("" for
// none); ARGV[3]: the new value (the value read: only the index changes);
// ARGV[4]: "1" to index the new value, else "0" to remove its entry
// Returns: 1 if it now holds the new value, 0 if it changed meanwhile.
var swapScript = shard.NewScript(`
local hash = ARGV[1] ~= ''
local cur
if hash then cur = redis.call('HGET', KEYS[1], ARGV[1]) else cur = redis.call('GET', KEYS[1]) end
cur = cur or ''
if cur ~= ARGV[2] then return 0 end
if ARGV[3] ~= cur then
  if hash then redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) else redis.call('SET', KEYS[1], ARGV[3]) end
end
if KEYS[2] then
  if ARGV[4] == '1' then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  else
    redis.call('HDEL', KEYS[2], ARGV[1])
  end
end
return 1`)

// swaps runs each compare-and-set of sws, in one round trip, and reports
// which took. It is not retried: a transition that lost its race must read
// the value again and decide anew.
func (a *Alarms) swaps(ctx context.Context, sws ...swap) ([]bool, error) {
	calls := make([]shard.Call, len(sws))
	for j, sw := range sws {
		flag := "0"
		if sw.open {
			flag = "1"
		}
		calls[j] = shard.Call{Keys: []string{sw.key}, Args: []string{sw.field, sw.old, sw.next, flag}}
		if sw.index != "" {
			calls[j].Keys = append(calls[j].Keys, sw.index)
		}
	}
	out := make([]bool, len(sws))
	for j, r := range a.store.ExecMulti(ctx, swapScript, calls...) {
		n, err := r.AsInt64()
		if err != nil {
			return nil, err
		}
		out[j] = n == 1
	}
	return out, nil
}

// swapState replaces id's state with next if it is still old, keeping the
// open index in step.
func (a *Alarms) swapState(ctx context.Context, id, old, next string, open bool) (bool, error) {
	k := a.store.Keys()
	ok, err := a.swaps(ctx, swap{key: k.InPart(id, statesLeaf), field: id, old: old, next: next,
		index: k.InPart(id, openLeaf), open: open})
	if err != nil {
		return false, fmt.Errorf("alarm: write state of %s: %w", id, err)
	}
	return ok[0], nil
}

// cas writes next over old and reports whether old was still current.
func (a *Alarms) cas(ctx context.Context, id string, old stored, next State) (stored, bool, error) {
	next.Version = old.Version + 1
	b, err := json.Marshal(next)
	if err != nil {
		return stored{}, false, fmt.Errorf("alarm: encode state of %s: %w", id, err)
	}
	ok, err := a.swapState(ctx, id, old.raw, string(b), next.Phase != Idle)
	if err != nil {
		return stored{}, false, err
	}
	if ok {
		a.remember(ctx, id, next.Version, string(b))
	}
	return stored{State: next, raw: string(b)}, ok, nil
}

// remember queues a written state for the durable registry, which keeps it
// unless it holds a later one; a scope alarm's, rare, is written at once.
func (a *Alarms) remember(ctx context.Context, id string, version int64, raw string) {
	if a.opts.Registry == nil {
		return
	}
	if sc, ok := scopeOf(id); ok {
		if err := a.persistScope(ctx, sc, "", raw); err != nil {
			a.log.Warn("storm alarm state not written to the registry; written again at its next change", "scope", sc, "err", err)
		}
		return
	}
	a.opts.Registry.Later(ctx, id, keepAlarm(version, raw))
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
		ok, err := a.swapState(ctx, id, old.raw, raw, st.Phase != Idle)
		if err != nil {
			return err
		}
		if ok {
			now := a.opts.Now()
			if err := a.reseat(ctx, st, now); err != nil {
				return err
			}
			return a.putBackTimer(ctx, id, st.wake(now.UnixMilli(), pendingRetry), now)
		}
	}
	return errContended
}

// current returns id's current deadline (0: not watched).
func (a *Alarms) current(ctx context.Context, id string) (int64, error) {
	d, err := a.store.Deadline(ctx, a.topo.Current(), id)
	if err != nil {
		return 0, fmt.Errorf("alarm: deadline of %s: %w", id, err)
	}
	return d.At, nil
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
	return a.rearm(ctx, id, at, 0)
}

// putBackTimer makes id's timer fire no later than at for a state put
// back. A timer that may be claimed now gets a new score as in arm: a
// scanner may have claimed it before the state was there, found nothing
// to do and be about to remove it by compare-and-remove.
func (a *Alarms) putBackTimer(ctx context.Context, id string, at int64, now time.Time) error {
	return a.rearm(ctx, id, at, now.Add(armSkew).UnixMilli())
}

// rearm arms id's timer in its shard for a state already written (see
// shard.Store.Arm for horizon).
func (a *Alarms) rearm(ctx context.Context, id string, at, horizon int64) error {
	if at <= 0 {
		return nil
	}
	i := shard.Of(id, a.rtopo.Current().Shards)
	if _, _, err := a.timers.Arm(ctx, shard.Repeats, i, id, at, horizon, true); err != nil {
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
