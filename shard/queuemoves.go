package shard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// Generic timers across a doubling. Every write to a timer is fenced by the
// layout of the shard it lands in (timerFence): once a doubling is
// published, a timer's old copy takes no write, from any process, whatever
// topology it has seen. A writer that knows the doubling first carries the
// old copy to the new shard (MoveTimers), then writes there; one that does
// not is refused by the old shard, reads the topology, and does the same.
// A carry marks the member in its new shard, once: a later carry, made
// from a read of the old copy older than a write that came since, changes
// nothing. So the old copy is what the timer was when the doubling was
// published, the new copy holds everything written after, and no move or
// copy ever undoes an acknowledged write.

// ResetTimers places rs under the writer's topology and writes them. While
// a doubling drains, each timer that moved is first carried to its new
// shard (MoveTimers). A shard that refuses (the writer had not seen a
// doubling) gets its resets placed, carried and written again under the
// topology read afresh. It may be retried.
func (w *Writer) ResetTimers(ctx context.Context, rs []TimerReset) error {
	return w.ResetTimersStored(ctx, rs, nil)
}

// ResetTimersStored is ResetTimers that gives stored each reset with its
// timer as stored: the deadline that holds and the payload it has.
func (w *Writer) ResetTimersStored(ctx context.Context, rs []TimerReset, stored func(TimerReset, Timer)) error {
	return onTimers(ctx, w, rs, func(r TimerReset) string { return r.Member }, func(t Topology, by map[int][]TimerReset) ([]int, error) {
		return w.store.resetTimersAt(ctx, t, by, stored)
	})
}

// CancelTimer removes the timer of member so that it never fires, and
// reports whether there was one. While a doubling drains it carries the
// timer first, so that no carry made from an older read brings it back.
// Like a reset, it is refused while a loss is open: a restore puts the
// timers back from their journal, which a cancel then would miss.
func (w *Writer) CancelTimer(ctx context.Context, member string) (bool, error) {
	removed := false
	err := onTimers(ctx, w, []string{member}, func(m string) string { return m }, func(t Topology, _ map[int][]string) ([]int, error) {
		ok, refused, err := w.store.cancelTimerAt(ctx, t, member)
		removed = removed || ok
		return refused, err
	})
	return removed, err
}

// onTimers places items (the member of each given by id) under the
// writer's topology, carries the moved ones while a doubling drains, and
// writes them with write, which returns the shards that refused theirs.
// Those items are carried and written again under the topology read
// afresh; a doubling raises the layouts just before it publishes itself, so
// a refusal may come a moment before a newer topology can be read.
func onTimers[T any](ctx context.Context, w *Writer, items []T, id func(T) string, write func(t Topology, by map[int][]T) ([]int, error)) error {
	t := w.current()
	for {
		by := make(map[int][]T)
		for _, it := range items {
			i := Of(id(it), t.Shards)
			by[i] = append(by[i], it)
		}
		w.begin(t)
		var refused []int
		err := carryMoved(ctx, w, t, items, id)
		if err == nil {
			refused, err = write(t, by)
		}
		w.end(t)
		switch {
		case errors.Is(err, ErrStaleTopology):
			// The carry was refused: all of it again.
		case err != nil || len(refused) == 0:
			return err
		default:
			var again []T
			for _, i := range refused {
				again = append(again, by[i]...)
			}
			items = again
		}
		nt, err := w.newer(ctx, t)
		if err != nil {
			return err
		}
		t = nt
	}
}

// newer reads the topology until it is newer than t, for up to
// staleRetries attempts staleWait apart.
func (w *Writer) newer(ctx context.Context, t Topology) (Topology, error) {
	for attempt := 0; ; attempt++ {
		nt, err := w.refresh(ctx)
		if err != nil {
			return t, fmt.Errorf("%w: %w", ErrStaleTopology, err)
		}
		if nt.Epoch > t.Epoch {
			return nt, nil
		}
		if attempt >= staleRetries {
			return t, fmt.Errorf("%w (epoch %d): no newer topology to place it under; see `sigwatch shards status`", ErrStaleTopology, t.Epoch)
		}
		select {
		case <-ctx.Done():
			return t, ctx.Err()
		case <-time.After(staleWait):
		}
	}
}

// carryMoved carries, while t drains a doubling, the timers among items
// that moved in it.
func carryMoved[T any](ctx context.Context, w *Writer, t Topology, items []T, id func(T) string) error {
	if !t.Draining() {
		return nil
	}
	var moved []string
	for _, it := range items {
		if m := id(it); Of(m, t.Prev) != Of(m, t.Shards) {
			moved = append(moved, m)
		}
	}
	return w.moveTimers(ctx, t, moved, 0)
}

// MoveTimers carries members still in their old shard while a doubling
// drains to their new shard, with their payloads, marking each carried
// (see carryScript), and then removes the old copies if unchanged. A copy
// due before notBefore (unix ms, 0: none) stays, unmarked: it fires from
// where it is. Between the two writes both copies hold the same deadline,
// and the crossing rule fires only the new one.
func (w *Writer) MoveTimers(ctx context.Context, members []string, notBefore int64) error {
	return w.moveTimers(ctx, w.current(), members, notBefore)
}

func (w *Writer) moveTimers(ctx context.Context, t Topology, members []string, notBefore int64) error {
	if !t.Draining() || len(members) == 0 {
		return nil
	}
	s := w.store
	cmds := make(rueidis.Commands, 0, 2*len(members))
	for _, m := range members {
		i := Of(m, t.Prev)
		cmds = append(cmds, s.c.B().Zscore().Key(s.k.Timers(Timers, i)).Member(m).Build(),
			s.c.B().Hget().Key(s.k.TimerPayloads(i)).Field(m).Build())
	}
	rs := s.c.DoMulti(ctx, cmds...)
	if w.moveRead != nil {
		w.moveRead()
	}
	var (
		carry []carried
		old   []Entry
	)
	for j, m := range members {
		c := carried{member: m}
		sc, err := rs[2*j].AsFloat64()
		switch {
		case rueidis.IsRedisNil(err):
		case err != nil:
			return fmt.Errorf("shard: move timers: %w", err)
		case int64(sc) < notBefore:
			continue
		default:
			c.deadline = int64(sc)
			old = append(old, Entry{ID: m, Deadline: c.deadline})
			switch p, err := rs[2*j+1].ToString(); {
			case err == nil:
				c.payload = "p" + p
			case !rueidis.IsRedisNil(err):
				return fmt.Errorf("shard: move timers: %w", err)
			}
		}
		carry = append(carry, c)
	}
	if len(carry) == 0 {
		return nil
	}
	by := make(map[int][]carried)
	for _, c := range carry {
		i := Of(c.member, t.Shards)
		by[i] = append(by[i], c)
	}
	refused, err := s.carryAt(ctx, t, by)
	if err != nil {
		return err
	}
	if len(refused) > 0 {
		// The new shards refuse only a writer older than their floor: the
		// doubling has drained meanwhile, and its old copies are gone.
		return fmt.Errorf("%w: the doubling to %d shards drained while timers were carried; carry again", ErrStaleTopology, t.Shards)
	}
	return s.removeTimersIf(ctx, t.Prev, old)
}

// carried is one timer as a move carries it: its old copy's deadline (0:
// it had none, only the mark is written) and payload ("p".. or "": none).
type carried struct {
	member   string
	deadline int64
	payload  string
}

// carriedKeep is how long the marks of carried timers are kept after their
// shard last got one: they matter only while the doubling drains.
const carriedKeep = 24 * time.Hour

// carryScript writes carried copies of timers into their new shard, fenced
// by timerFence. Only the first carry of a member writes anything: it marks
// the member carried, and writes the copy (extend, payload set if absent).
// A later one was read from the old copy before the first carry's write,
// so before any write since: it changes nothing.
//
// KEYS[1]: timer ZSET of the new shard; KEYS[2]: layout HASH;
// KEYS[3]: payloads; KEYS[4]: carried marks (member -> 1); KEYS[5]: wake key
// ARGV[1..3]: see timerFence; ARGV[4]: how long the marks are kept, ms
// ARGV[5..]: triples of member, deadline ("0": mark only) and payload
// ("p"..payload, "": none)
// Returns: how many copies were written.
var carryScript = NewScript(wakeLua + timerFence + `
local n, low = 0, nil
for i = 5, #ARGV, 3 do
  local m = ARGV[i]
  if redis.call('HSETNX', KEYS[4], m, '1') == 1 and ARGV[i+1] ~= '0' then
    redis.call('ZADD', KEYS[1], 'GT', ARGV[i+1], m)
    local d = tonumber(redis.call('ZSCORE', KEYS[1], m))
    if not low or d < low then low = d end
    if ARGV[i+2] ~= '' then redis.call('HSETNX', KEYS[3], m, string.sub(ARGV[i+2], 2)) end
    n = n + 1
  end
end
redis.call('PEXPIRE', KEYS[4], ARGV[4])
wake(KEYS[5], low)
return n`)

// carryAt writes carried timers placed in by under t, and returns the
// shards that refused.
func (s *Store) carryAt(ctx context.Context, t Topology, by map[int][]carried) ([]int, error) {
	shards := make([]int, 0, len(by))
	execs := make([]rueidis.LuaExec, 0, len(by))
	for i, cs := range by {
		args := append(make([]string, 0, 4+3*len(cs)), strconv.FormatInt(t.Epoch, 10), s.Generation(), strconv.Itoa(t.Shards),
			strconv.FormatInt(carriedKeep.Milliseconds(), 10))
		for _, c := range cs {
			args = append(args, c.member, strconv.FormatInt(c.deadline, 10), c.payload)
		}
		shards = append(shards, i)
		execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.Timers(Timers, i), s.k.Layout(i), s.k.TimerPayloads(i), s.k.TimersCarried(i), s.k.Wake(Timers, i)}, Args: args})
	}
	return s.fencedRun(ctx, carryScript, shards, execs, "carry timers to")
}

// removeIfScript removes members whose score is still the given one, with
// their payloads.
//
// KEYS[1]: timer ZSET; KEYS[2]: payloads; ARGV: member, score pairs
var removeIfScript = NewScript(`
local n = 0
for i = 1, #ARGV, 2 do
  local cur = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if cur and tonumber(cur) == tonumber(ARGV[i+1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    n = n + 1
  end
end
return n`)

// removeTimersIf removes the copies es from their shards among n, each only
// if its score is unchanged.
func (s *Store) removeTimersIf(ctx context.Context, n int, es []Entry) error {
	by := Place(es, n)
	execs := make([]rueidis.LuaExec, 0, len(by))
	for i, es := range by {
		args := make([]string, 0, 2*len(es))
		for _, e := range es {
			args = append(args, e.ID, strconv.FormatInt(e.Deadline, 10))
		}
		execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.Timers(Timers, i), s.k.TimerPayloads(i)}, Args: args})
	}
	for _, r := range removeIfScript.execMulti(ctx, s.c, execs...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: remove moved timers: %w", err)
		}
	}
	return nil
}

// cancelScript removes a timer and its payload from one shard, fenced by
// timerFence.
//
// KEYS[1]: timer ZSET; KEYS[2]: layout HASH; KEYS[3]: payloads
// ARGV[1..3]: see timerFence; ARGV[4]: member
// Returns: 1 if the timer was there, else 0.
var cancelScript = NewScript(timerFence + `
redis.call('HDEL', KEYS[3], ARGV[4])
return redis.call('ZREM', KEYS[1], ARGV[4])`)

// cancelTimerAt removes the timer of member from every shard it may be in
// under t, and returns whether one held it and the shards that refused.
func (s *Store) cancelTimerAt(ctx context.Context, t Topology, member string) (bool, []int, error) {
	shards := timerShards(t, member)
	execs := make([]rueidis.LuaExec, len(shards))
	for j, i := range shards {
		execs[j] = rueidis.LuaExec{Keys: []string{s.k.Timers(Timers, i), s.k.Layout(i), s.k.TimerPayloads(i)},
			Args: []string{strconv.FormatInt(t.Epoch, 10), s.Generation(), strconv.Itoa(t.Shards), member}}
	}
	var (
		removed bool
		refused []int
	)
	for j, r := range cancelScript.execMulti(ctx, s.c, execs...) {
		n, err := r.AsInt64()
		switch {
		case err == nil:
			removed = removed || n > 0
		case errors.Is(err, ErrStaleTopology):
			// Placed again under a newer topology, the member lands in
			// its shard there: refused means "not done under t".
			refused = append(refused, Of(member, t.Shards))
		default:
			return removed, refused, fmt.Errorf("shard: cancel timer in shard %d: %w", shards[j], err)
		}
	}
	return removed, refused, nil
}

// timerShards are the shards a timer may be in: its shard under t, and
// under the previous shard count while a doubling drains.
func timerShards(t Topology, member string) []int {
	out := []int{Of(member, t.Shards)}
	if t.Prev != 0 {
		if i := Of(member, t.Prev); i != out[0] {
			out = append(out, i)
		}
	}
	return out
}

// Moved returns the generic timers of shard i that belong to another
// shard among n (moved by the doubling that drains), at most about limit.
func (q QueueTimers) Moved(ctx context.Context, i, n, limit int) ([]string, error) {
	var out []string
	err := q.s.scanMembers(ctx, q.s.k.Timers(Timers, i), func(m string) bool {
		if Of(m, n) != i {
			out = append(out, m)
		}
		return len(out) < limit
	})
	if err != nil {
		return out, fmt.Errorf("shard: scan timers of shard %d: %w", i, err)
	}
	return out, nil
}
