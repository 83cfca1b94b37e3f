package alarm

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// Rate limits protect what consumes the notifications. Options.Rate caps
// the notifications of each type (as it appears in the subject) per
// second and Options.RateTotal those of all types, across every replica:
// the pace lives in Redis (reserveSlots), where each note gets
// a send slot GCRA-style, one emission interval after the last of its type
// and of all. A note is published at its slot or later, never dropped:
// the device's timer wakes it at its slot. Slots are written into the
// device's state before anything is published, so a retry after a crash
// or a failed publish reuses its slot instead of taking another. Repeats of
// an alarm waiting for their slot are coalesced (machine.note).

// minRate and maxRate bound a rate limit: one notification in 1000
// seconds, one a millisecond (slots are whole milliseconds).
const (
	minRate = 0.001
	maxRate = 1000
)

// Spacing is the interval between two notifications paced at rate per
// second (0: unlimited): a tenth wider than 1/rate, rounded up to a whole
// millisecond. The rate is a ceiling on what downstream sees in any
// second, and notes are published a little after their slots; the tenth
// lets that lag reach 100 ms, at any rate, before a second could hold more
// than rate of them.
func Spacing(rate float64) time.Duration {
	if rate <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(1100/min(max(rate, minRate), maxRate))) * time.Millisecond
}

func emission(rate float64) time.Duration { return Spacing(rate) }

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

// slots gives every pending note of st that has no send slot (and is not
// muted) one, in place, and returns the notes it gave one, to be counted
// once st is written (see counted). Transitions reserve the slots of the
// notes they decide, so that they are written, and the timer armed for
// them, with the transition itself.
func (a *Alarms) slots(ctx context.Context, id string, st *State, now int64) ([]Note, error) {
	if !a.limited() {
		return nil, nil
	}
	var types []string
	var idx []int
	for j, n := range st.Pending {
		if n.Slot == 0 && !n.Muted {
			// Paced per subject: every type beyond nats.max_types shares
			// the subject (and the pace) of "other".
			types = append(types, a.pub.Subjects().Token(n.Type))
			idx = append(idx, j)
		}
	}
	if len(idx) == 0 {
		return nil, nil
	}
	got, err := a.reserveSlots(ctx, now, types, emission(a.opts.Rate), emission(a.opts.RateTotal))
	if err != nil {
		return nil, fmt.Errorf("alarm: pace notifications of %s: %w", id, err)
	}
	st.Pending = slices.Clone(st.Pending)
	out := make([]Note, len(idx))
	for k, j := range idx {
		st.Pending[j].Slot = got[k]
		out[k] = st.Pending[j]
	}
	return out, nil
}

// The pace of each type is the STRING {rate}:type:<type> holding its
// theoretical arrival time (TAT, unix ms) of the next notification; the
// total pace is {rate}:total. Every rate key carries the hash tag {rate},
// so one script reserves across them on a Redis Cluster.
const (
	rateTag       = "rate"
	rateTotalLeaf = "total"
	rateTypeLeaf  = "type:"
)

// reserveScript reserves send slots GCRA-style, one per notification in
// order: a slot is the latest of now, its type's TAT and the total TAT, and
// moves each TAT to the slot plus its emission interval. Slots of one type
// are thus at least its interval apart (no burst beyond one), and slots of
// all types the total interval apart. A TAT key expires a minute after its
// time, when it no longer delays anything.
//
// KEYS[1]: total TAT; KEYS[2..n+1]: the type TAT of each notification
// ARGV[1]: now, unix ms
// ARGV[2]: emission interval per type, ms (0: no limit per type)
// ARGV[3]: emission interval of all types, ms (0: no total limit)
// Returns: the n slots, unix ms.
var reserveScript = shard.NewScript(`
local now, per, all = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local total = tonumber(redis.call('GET', KEYS[1]) or '0')
local out = {}
for j = 2, #KEYS do
  local slot = now
  if per > 0 then
    local tat = tonumber(redis.call('GET', KEYS[j]) or '0')
    if tat > slot then slot = tat end
  end
  if all > 0 and total > slot then slot = total end
  if per > 0 then
    redis.call('SET', KEYS[j], slot + per, 'PX', slot + per - now + 60000)
  end
  if all > 0 then total = slot + all end
  out[#out + 1] = slot
end
if all > 0 then
  redis.call('SET', KEYS[1], total, 'PX', total - now + 60000)
end
return out`)

// reserveSlots reserves a send slot for each of len(types) notifications,
// types[j] being the sanitised type of the j-th, at now (unix ms, on
// sigwatch's one clock). per and all are the emission intervals of one type
// and of all types (0: unlimited), whole milliseconds. Slots are returned
// in the order of types.
func (a *Alarms) reserveSlots(ctx context.Context, now int64, types []string, per, all time.Duration) ([]int64, error) {
	if len(types) == 0 {
		return nil, nil
	}
	k := a.store.Keys()
	keys := make([]string, 0, len(types)+1)
	keys = append(keys, k.Tagged(rateTag, rateTotalLeaf))
	for _, t := range types {
		keys = append(keys, k.Tagged(rateTag, rateTypeLeaf+t))
	}
	args := []string{strconv.FormatInt(now, 10), strconv.FormatInt(per.Milliseconds(), 10),
		strconv.FormatInt(all.Milliseconds(), 10)}
	v, err := a.store.Exec(ctx, reserveScript, keys, args).Array()
	if err == nil && len(v) != len(types) {
		err = fmt.Errorf("got %d slots for %d notifications", len(v), len(types))
	}
	if err != nil {
		return nil, fmt.Errorf("alarm: reserve send slots: %w", err)
	}
	out := make([]int64, len(v))
	for j, x := range v {
		if out[j], err = x.AsInt64(); err != nil {
			return nil, fmt.Errorf("alarm: reserve send slots: %w", err)
		}
	}
	return out, nil
}

// counted counts notes given a slot at now into the metrics.
func (a *Alarms) counted(notes []Note, now int64) {
	for _, n := range notes {
		if n.Slot > now {
			a.m.delayed.WithLabelValues(a.pub.Subjects().Token(n.Type)).Inc()
		}
		a.m.delay.Observe(float64(max(n.Slot-n.At, 0)) / 1e3)
	}
}

// reserve gives the pending notes of st that have no send slot one (notes
// a transition decided have theirs already; these are left from a state
// written without limits) and writes them with a compare-and-set before
// anything is published, arming the timer for the earliest slot first. It
// returns the state in force afterwards, and false when another transition
// came first: its state is returned (the slots reserved are left unused,
// a gap in the pace, never an excess).
func (a *Alarms) reserve(ctx context.Context, id string, st stored, now time.Time) (stored, bool, error) {
	ms := now.UnixMilli()
	next := st.State
	got, err := a.slots(ctx, id, &next, ms)
	if err != nil || len(got) == 0 {
		return st, err == nil, err
	}
	if err := a.arm(ctx, id, next.wake(ms, pendingRetry), now); err != nil {
		return st, false, err
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
		// The arming may have moved a timer the winner's state needs.
		if err := a.restore(ctx, id, won.wake(ms, pendingRetry)); err != nil {
			return won, false, err
		}
		return won, false, nil
	}
	a.counted(got, ms)
	return cur, true, nil
}
