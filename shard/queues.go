package shard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// The generic timers (family Timers) are keyed timers of named queues: a
// member is TimerMember(queue, id), scored by its deadline, in the
// deadlines' shards. A timer that has a payload keeps it in its shard's
// payload HASH (Keys.TimerPayloads), so a timer without one costs what a
// device deadline costs.

// TimerMember is the member of timer id of queue. A queue name never holds
// '/', so the first '/' splits it back.
func TimerMember(queue, id string) string { return queue + "/" + id }

// SplitTimerMember returns the queue and id of a timer member.
func SplitTimerMember(m string) (queue, id string, ok bool) { return strings.Cut(m, "/") }

// TimerReset is one reset of a generic timer.
type TimerReset struct {
	Member   string
	Deadline int64 // unix ms
	// Set overwrites the deadline, even to an earlier one; otherwise it
	// only ever moves later (ZADD GT).
	Set bool
	// Payload replaces the timer's payload when not nil; ClearPayload
	// removes it; neither keeps it.
	Payload      []byte
	ClearPayload bool
}

// plain reports whether r is a reset the native write path can take: it
// only pushes a deadline later and leaves the payload alone.
func (r TimerReset) plain() bool { return !r.Set && r.Payload == nil && !r.ClearPayload }

// resetTimersScript writes resets that set a deadline exactly or touch a
// payload, fenced by writerFence.
// A timer that was absent loses any payload left of an earlier life.
//
// KEYS[1]: timer ZSET of one shard; KEYS[2]: layout HASH; KEYS[3]: payloads
// ARGV[1]: epoch of the writer's topology (0: not checked)
// ARGV[2]: the writer's generation ("" to skip the check)
// ARGV[3..]: quads of mode ("e" extend, "s" set), deadline, member and
// payload op: "k" keep, "c" clear, "p"..payload set, "m"..payload set if
// the timer has none (a copy moved by a doubling).
var resetTimersScript = newScript(writerFence + `
for i = 3, #ARGV, 4 do
  local m = ARGV[i+2]
  local had = redis.call('ZSCORE', KEYS[1], m)
  if ARGV[i] == 's' then
    redis.call('ZADD', KEYS[1], ARGV[i+1], m)
  else
    redis.call('ZADD', KEYS[1], 'GT', ARGV[i+1], m)
  end
  local op = string.sub(ARGV[i+3], 1, 1)
  if op == 'p' then
    redis.call('HSET', KEYS[3], m, string.sub(ARGV[i+3], 2))
  elseif op == 'm' then
    redis.call('HSETNX', KEYS[3], m, string.sub(ARGV[i+3], 2))
  elseif op == 'c' or not had then
    redis.call('HDEL', KEYS[3], m)
  end
end
return 1`)

// ResetTimersAt writes resets placed in byShard under the topology of
// epoch (0: not checked). Shards whose floor is above epoch refuse theirs
// and are returned in refused. Resets that only push a deadline later take
// the native path of UpsertAt; the others go through resetTimersScript.
func (s *Store) ResetTimersAt(ctx context.Context, epoch int64, byShard map[int][]TimerReset) (refused []int, err error) {
	plain := make(map[int][]Entry)
	var (
		rest  []int
		execs []rueidis.LuaExec
	)
	ep, gen := strconv.FormatInt(epoch, 10), s.Generation()
	for i, rs := range byShard {
		// A timer with a reset the script must write has all its resets of
		// the batch written there, in order.
		scripted := make(map[string]bool)
		for _, r := range rs {
			if !r.plain() {
				scripted[r.Member] = true
			}
		}
		var args []string
		for _, r := range rs {
			if !scripted[r.Member] {
				plain[i] = append(plain[i], Entry{ID: r.Member, Deadline: r.Deadline})
				continue
			}
			if args == nil {
				args = append(make([]string, 0, 2+4*len(rs)), ep, gen)
			}
			mode, op := "e", "k"
			if r.Set {
				mode = "s"
			}
			switch {
			case r.Payload != nil:
				op = "p" + string(r.Payload)
			case r.ClearPayload:
				op = "c"
			}
			args = append(args, mode, strconv.FormatInt(r.Deadline, 10), r.Member, op)
		}
		if args != nil {
			rest = append(rest, i)
			execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.Timers(Timers, i), s.k.Layout(i), s.k.TimerPayloads(i)}, Args: args})
		}
	}
	if len(plain) > 0 {
		if _, refused, err = s.UpsertAt(ctx, Timers, epoch, plain, nil); err != nil {
			return refused, err
		}
	}
	for j, r := range resetTimersScript.execMulti(ctx, s.c, execs...) {
		switch rerr := r.Error(); {
		case rerr == nil:
		case errors.Is(rerr, ErrStaleTopology):
			if !containsInt(refused, rest[j]) {
				refused = append(refused, rest[j])
			}
		default:
			s.lossSeen(rerr)
			if err == nil {
				err = fmt.Errorf("shard: reset timers in shard %d: %w", rest[j], rerr)
			}
		}
	}
	return refused, err
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// ResetTimers places rs under the writer's topology and writes them (see
// Store.ResetTimersAt), placing again what a shard refused. While a
// doubling drains, a timer that moved is carried to its new shard whole
// (MoveTimers) before the reset is written there, so that its old copy
// neither holds its deadline later than a reset set it nor fires with an
// old payload. It may be retried.
func (w *Writer) ResetTimers(ctx context.Context, rs []TimerReset) error {
	if t := w.current(); t.Draining() {
		var moved []string
		for _, r := range rs {
			if Of(r.Member, t.Prev) != Of(r.Member, t.Shards) {
				moved = append(moved, r.Member)
			}
		}
		if len(moved) > 0 {
			if err := w.MoveTimers(ctx, moved, 0); err != nil {
				return err
			}
		}
	}
	return placed(ctx, w, rs, func(r TimerReset) string { return r.Member }, func(epoch int64, by map[int][]TimerReset) ([]int, error) {
		return w.store.ResetTimersAt(ctx, epoch, by)
	})
}

// MoveTimers carries the copies of members still in their old shard while
// a doubling drains to their new shard, with their payloads, and removes
// the old copies if unchanged meanwhile. A copy due before notBefore (unix
// ms, 0: none) stays: it fires from where it is. Between the two writes
// both copies hold the same deadline, and the crossing rule fires only the
// new one.
func (w *Writer) MoveTimers(ctx context.Context, members []string, notBefore int64) error {
	t := w.current()
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
	var (
		carry []TimerReset
		old   []Entry
	)
	for j, m := range members {
		sc, err := rs[2*j].AsFloat64()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("shard: move timers: %w", err)
		}
		if int64(sc) < notBefore {
			continue
		}
		r := TimerReset{Member: m, Deadline: int64(sc)}
		switch p, err := rs[2*j+1].ToString(); {
		case err == nil:
			r.Payload = append([]byte("m"), p...)
		case !rueidis.IsRedisNil(err):
			return fmt.Errorf("shard: move timers: %w", err)
		}
		carry, old = append(carry, r), append(old, Entry{ID: m, Deadline: int64(sc)})
	}
	if len(carry) == 0 {
		return nil
	}
	err := placed(ctx, w, carry, func(r TimerReset) string { return r.Member }, func(epoch int64, by map[int][]TimerReset) ([]int, error) {
		return s.moveTimersAt(ctx, epoch, by)
	})
	if err != nil {
		return err
	}
	return s.removeTimersIf(ctx, t.Prev, old)
}

// moveTimersAt writes carried copies: extend, payload set only if absent
// (the "m" op, which ResetTimersAt's encoding cannot express).
func (s *Store) moveTimersAt(ctx context.Context, epoch int64, by map[int][]TimerReset) ([]int, error) {
	ep, gen := strconv.FormatInt(epoch, 10), s.Generation()
	var (
		shards []int
		execs  []rueidis.LuaExec
	)
	for i, rs := range by {
		args := append(make([]string, 0, 2+4*len(rs)), ep, gen)
		for _, r := range rs {
			op := "k"
			if r.Payload != nil {
				op = string(r.Payload) // already "m"..payload
			}
			args = append(args, "e", strconv.FormatInt(r.Deadline, 10), r.Member, op)
		}
		shards = append(shards, i)
		execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.Timers(Timers, i), s.k.Layout(i), s.k.TimerPayloads(i)}, Args: args})
	}
	var refused []int
	for j, r := range resetTimersScript.execMulti(ctx, s.c, execs...) {
		switch err := r.Error(); {
		case err == nil:
		case errors.Is(err, ErrStaleTopology):
			refused = append(refused, shards[j])
		default:
			s.lossSeen(err)
			return refused, fmt.Errorf("shard: move timers to shard %d: %w", shards[j], err)
		}
	}
	return refused, nil
}

// removeIfScript removes members whose score is still the given one, with
// their payloads.
//
// KEYS[1]: timer ZSET; KEYS[2]: payloads; ARGV: member, score pairs
var removeIfScript = newScript(`
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

// timerShards are the shards a timer may be in: its shard under the
// topology read now, under the previous shard count while a doubling
// drains, and under twice the count, should a doubling be published after
// the read.
func timerShards(t Topology, member string) []int {
	out := []int{Of(member, t.Shards)}
	add := func(n int) {
		if n >= 1 && n <= MaxShards {
			if i := Of(member, n); !containsInt(out, i) {
				out = append(out, i)
			}
		}
	}
	if t.Prev != 0 {
		add(t.Prev)
	}
	add(2 * t.Shards)
	return out
}

// Timer is a generic timer as stored.
type Timer struct {
	Member   string
	Deadline int64
	Payload  []byte // nil: none
}

// GetTimer returns the timer of member, and false if there is none. While a
// doubling drains it is the later of its copies, as the crossing rule fires
// it.
func (s *Store) GetTimer(ctx context.Context, member string) (Timer, bool, error) {
	t, err := s.Topology(ctx)
	if err != nil {
		return Timer{}, false, err
	}
	shards := timerShards(t, member)
	cmds := make(rueidis.Commands, 0, 2*len(shards))
	for _, i := range shards {
		cmds = append(cmds, s.c.B().Zscore().Key(s.k.Timers(Timers, i)).Member(member).Build(),
			s.c.B().Hget().Key(s.k.TimerPayloads(i)).Field(member).Build())
	}
	rs := s.c.DoMulti(ctx, cmds...)
	var (
		out   Timer
		found bool
	)
	for j := range shards {
		sc, err := rs[2*j].AsFloat64()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return Timer{}, false, fmt.Errorf("shard: get timer: %w", err)
		}
		if found && int64(sc) <= out.Deadline {
			continue
		}
		out, found = Timer{Member: member, Deadline: int64(sc)}, true
		p, err := rs[2*j+1].AsBytes()
		switch {
		case err == nil:
			out.Payload = p
		case !rueidis.IsRedisNil(err):
			return Timer{}, false, fmt.Errorf("shard: get timer: %w", err)
		}
	}
	return out, found, nil
}

// cancelScript removes a timer and its payload from one shard.
// KEYS[1]: timer ZSET; KEYS[2]: payloads; ARGV[1]: member
var cancelScript = newScript(`
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])`)

// CancelTimer removes the timer of member from every shard it may be in,
// and reports whether there was one.
func (s *Store) CancelTimer(ctx context.Context, member string) (bool, error) {
	t, err := s.Topology(ctx)
	if err != nil {
		return false, err
	}
	shards := timerShards(t, member)
	execs := make([]rueidis.LuaExec, len(shards))
	for j, i := range shards {
		execs[j] = rueidis.LuaExec{Keys: []string{s.k.Timers(Timers, i), s.k.TimerPayloads(i)}, Args: []string{member}}
	}
	removed := false
	for _, r := range cancelScript.execMulti(ctx, s.c, execs...) {
		n, err := r.AsInt64()
		if err != nil {
			return false, fmt.Errorf("shard: cancel timer: %w", err)
		}
		removed = removed || n > 0
	}
	return removed, nil
}

// TimerPayloads returns the payload of each member of shard i (nil where it
// has none), in one round trip.
func (s *Store) TimerPayloads(ctx context.Context, i int, members []string) ([][]byte, error) {
	if len(members) == 0 {
		return nil, nil
	}
	vs, err := s.c.Do(ctx, s.c.B().Hmget().Key(s.k.TimerPayloads(i)).Field(members...).Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("shard: timer payloads of shard %d: %w", i, err)
	}
	out := make([][]byte, len(members))
	for j, v := range vs {
		if b, err := v.AsBytes(); err == nil {
			out[j] = b
		}
	}
	return out, nil
}

// firedKeep is how long a fired mark of a generic timer is kept after its
// partition last got one: the crossing rule needs it only until the
// doubling drains.
const firedKeep = 24 * time.Hour

// MarkTimersFired records that each timer of es fired at its deadline, for
// the crossing rule while a doubling drains (see TimersFired).
func (s *Store) MarkTimersFired(ctx context.Context, es []Entry) error {
	by := make(map[string][]Entry)
	for _, e := range es {
		k := s.k.TimersFired(e.ID)
		by[k] = append(by[k], e)
	}
	cmds := make(rueidis.Commands, 0, 2*len(by))
	for k, es := range by {
		h := s.c.B().Hset().Key(k).FieldValue()
		for _, e := range es {
			h = h.FieldValue(e.ID, strconv.FormatInt(e.Deadline, 10))
		}
		cmds = append(cmds, h.Build(), s.c.B().Pexpire().Key(k).Milliseconds(firedKeep.Milliseconds()).Build())
	}
	for _, r := range s.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: mark timers fired: %w", err)
		}
	}
	return nil
}

// TimersFired returns, for each member, the deadline at which it last
// fired while a doubling drained (0 if none known).
func (s *Store) TimersFired(ctx context.Context, members []string) ([]int64, error) {
	cmds := make(rueidis.Commands, len(members))
	for j, m := range members {
		cmds[j] = s.c.B().Hget().Key(s.k.TimersFired(m)).Field(m).Build()
	}
	out := make([]int64, len(members))
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		v, err := r.AsInt64()
		switch {
		case err == nil:
			out[j] = v
		case !rueidis.IsRedisNil(err):
			return nil, fmt.Errorf("shard: timers fired: %w", err)
		}
	}
	return out, nil
}

// MovedTimers returns the generic timers of shard i that belong to another
// shard among n (moved by the doubling that drains), at most about limit.
func (s *Store) MovedTimers(ctx context.Context, i, n, limit int) ([]string, error) {
	var out []string
	err := s.scanMembers(ctx, s.k.Timers(Timers, i), func(m string) bool {
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
