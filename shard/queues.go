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

// QueueTimers is the generic timers of an installation's named queues, read
// and dropped outside the engine's claims: a timer by its member, payloads,
// the marks of timers firing and fired, and what a doubling or a restore
// moves. The timer role and the guard use it.
type QueueTimers struct{ s *Store }

// Timers returns the generic timers' operations.
func (s *Store) Timers() QueueTimers { return QueueTimers{s} }

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

// timerFence opens every script that writes the generic timers of a shard:
// writerFence (the floor, the generation), and the layout: a writer that
// knows fewer shards than the shard's layout allows is refused (STALE), as
// device removals are (fenceLua). A doubling raises the layout of every
// old shard before it is published, so once a timer may have moved, its
// old copy takes no write from anyone: it only fires, or is carried to its
// new shard (MoveTimers), where every later write goes.
//
// KEYS[2]: layout HASH of the shard
// ARGV[1]: epoch of the writer's topology (0: not checked)
// ARGV[2]: the writer's generation ("" to skip the check)
// ARGV[3]: the writer's shard count
const timerFence = writerFence + `
if tonumber(redis.call('HGET', KEYS[2], 'shards') or '0') > tonumber(ARGV[3]) then
  return redis.error_reply('STALE topology of ' .. ARGV[3] .. ' shards')
end
`

// resetTimersScript writes resets of generic timers, fenced by timerFence.
// An extend moves a deadline only later, a set to exactly its deadline. A
// timer that was absent loses any payload left of an earlier life. A reset
// that changes the payload of a timer being fired at the deadline it keeps
// (its payload already read for the event, see firingScript) moves it a
// millisecond later: the fire's compare-and-remove then keeps it, and it
// fires again with the new payload.
//
// KEYS[1]: timer ZSET of one shard; KEYS[2]: layout HASH; KEYS[3]: payloads;
// KEYS[4]: the shard's firing marks (member -> deadline); KEYS[5]: its wake
// key
// ARGV[1..3]: see timerFence
// ARGV[4..]: quads of mode ("e" extend, "s" set), deadline, member and
// payload op: "k" keep, "c" clear, "p"..payload set
// Returns: per quad, the deadline stored, ":", and the payload kept by a
// "k" (empty when none); or the error STALE or LOSTDATA.
var resetTimersScript = NewScript(wakeLua + timerFence + `
local low
local out = {}
for i = 4, #ARGV, 4 do
  local m = ARGV[i+2]
  local had = tonumber(redis.call('ZSCORE', KEYS[1], m))
  local d = tonumber(ARGV[i+1])
  if ARGV[i] == 'e' and had and had > d then d = had end
  local op = string.sub(ARGV[i+3], 1, 1)
  if had and d == had and op ~= 'k' and tonumber(redis.call('HGET', KEYS[4], m)) == had then
    local cur = redis.call('HGET', KEYS[3], m)
    if (op == 'c' and cur) or (op == 'p' and cur ~= string.sub(ARGV[i+3], 2)) then d = had + 1 end
  end
  redis.call('ZADD', KEYS[1], string.format('%d', d), m)
  if not low or d < low then low = d end
  local kept = ''
  if op == 'p' then
    redis.call('HSET', KEYS[3], m, string.sub(ARGV[i+3], 2))
  elseif op == 'c' or not had then
    redis.call('HDEL', KEYS[3], m)
  else
    kept = redis.call('HGET', KEYS[3], m) or ''
  end
  out[#out+1] = string.format('%d', d) .. ':' .. kept
end
wake(KEYS[5], low)
return out`)

// resetTimersAt writes resets placed in byShard under topology t. Shards
// that refuse theirs (t is older than the shard's floor or layout) are
// returned in refused. Each timer as stored is given to stored, if set.
func (s *Store) resetTimersAt(ctx context.Context, t Topology, byShard map[int][]TimerReset, stored func(TimerReset, Timer)) (refused []int, err error) {
	shards := make([]int, 0, len(byShard))
	execs := make([]rueidis.LuaExec, 0, len(byShard))
	for i, rs := range byShard {
		args := append(make([]string, 0, 3+4*len(rs)), strconv.FormatInt(t.Epoch, 10), s.Generation(), strconv.Itoa(t.Shards))
		for _, r := range rs {
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
		shards = append(shards, i)
		execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.Timers(Timers, i), s.k.Layout(i), s.k.TimerPayloads(i), s.k.TimersFiring(i), s.k.Wake(Timers, i)}, Args: args})
	}
	replies := resetTimersScript.execMulti(ctx, s.c, execs...)
	if stored != nil {
		for j, r := range replies {
			if outs, err := r.AsStrSlice(); err == nil {
				storedTimers(byShard[shards[j]], outs, stored)
			}
		}
	}
	return s.refusals(replies, shards, "reset timers in")
}

// storedTimers gives stored each reset of rs with its timer as the reset
// script answered it (outs).
func storedTimers(rs []TimerReset, outs []string, stored func(TimerReset, Timer)) {
	for k, out := range outs {
		if k >= len(rs) {
			return
		}
		d, kept, _ := strings.Cut(out, ":")
		t := Timer{Member: rs[k].Member, Payload: rs[k].Payload}
		t.Deadline, _ = strconv.ParseInt(d, 10, 64)
		if kept != "" {
			t.Payload = []byte(kept)
		}
		stored(rs[k], t)
	}
}

// fencedRun runs script once per shard of shards (execs in the same order)
// and returns the shards that refused as placed under an old topology,
// and the first other failure.
func (s *Store) fencedRun(ctx context.Context, script *Script, shards []int, execs []rueidis.LuaExec, what string) (refused []int, err error) {
	return s.refusals(script.execMulti(ctx, s.c, execs...), shards, what)
}

// refusals returns the shards whose reply refused a write placed under an
// old topology, and the first other failure.
func (s *Store) refusals(replies []Reply, shards []int, what string) (refused []int, err error) {
	for j, r := range replies {
		switch rerr := r.Error(); {
		case rerr == nil:
		case errors.Is(rerr, ErrStaleTopology):
			refused = append(refused, shards[j])
		default:
			s.lossSeen(rerr)
			if err == nil {
				err = fmt.Errorf("shard: %s shard %d: %w", what, shards[j], rerr)
			}
		}
	}
	return refused, err
}

// Timer is a generic timer as stored.
type Timer struct {
	Member   string
	Deadline int64
	Payload  []byte // nil: none
}

// Get returns the timer of member, and false if there is none. While a
// doubling drains it is the later of its copies, as the crossing rule fires
// it.
func (q QueueTimers) Get(ctx context.Context, member string) (Timer, bool, error) {
	t, err := q.s.Topology(ctx)
	if err != nil {
		return Timer{}, false, err
	}
	shards := timerShards(t, member)
	cmds := make(rueidis.Commands, 0, 2*len(shards))
	for _, i := range shards {
		cmds = append(cmds, q.s.c.B().Zscore().Key(q.s.k.Timers(Timers, i)).Member(member).Build(),
			q.s.c.B().Hget().Key(q.s.k.TimerPayloads(i)).Field(member).Build())
	}
	rs := q.s.c.DoMulti(ctx, cmds...)
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

// Payloads returns the payload of each member of shard i (nil where it
// has none), in one round trip.
func (q QueueTimers) Payloads(ctx context.Context, i int, members []string) ([][]byte, error) {
	if len(members) == 0 {
		return nil, nil
	}
	vs, err := q.s.c.Do(ctx, q.s.c.B().Hmget().Key(q.s.k.TimerPayloads(i)).Field(members...).Build()).ToArray()
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

// firingScript reads the payloads of claimed timers for their events, each
// only if its deadline is still the one it was claimed at (a reset that
// landed since leaves it to be claimed again), and marks each one read as
// firing at that deadline until the settle: a reset that then changes its
// payload moves it (see resetTimersScript), so that no event carries a
// payload older than the timer's and none is lost.
//
// KEYS[1]: timer ZSET of one shard; KEYS[2]: payloads; KEYS[3]: firing
// marks (member -> deadline)
// ARGV[1]: how long the marks are kept, ms; ARGV[2..]: member, claimed
// deadline pairs
// Returns: per member "p"..payload, "n" (no payload) or "x" (moved since
// the claim, or gone).
var firingScript = NewScript(`
local out = {}
for i = 2, #ARGV, 2 do
  local cur = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if not cur or tonumber(cur) ~= tonumber(ARGV[i+1]) then
    out[#out+1] = 'x'
  else
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i+1])
    local p = redis.call('HGET', KEYS[2], ARGV[i])
    if p then out[#out+1] = 'p' .. p else out[#out+1] = 'n' end
  end
end
redis.call('PEXPIRE', KEYS[3], ARGV[1])
return out`)

// firingKeep is how long the firing marks outlive their last use, should
// an owner die before settling: the next owner claims the timer again.
const firingKeep = time.Hour

// FiringPayloads returns, for timers of shard i claimed due at their
// deadlines es, the payload of each (nil where it has none), and which
// changed since the claim (firing them now would fire a stale timer).
func (q QueueTimers) FiringPayloads(ctx context.Context, i int, es []Entry) (payloads [][]byte, changed []bool, err error) {
	if len(es) == 0 {
		return nil, nil, nil
	}
	args := make([]string, 0, 1+2*len(es))
	args = append(args, strconv.FormatInt(firingKeep.Milliseconds(), 10))
	for _, e := range es {
		args = append(args, e.ID, strconv.FormatInt(e.Deadline, 10))
	}
	vs, err := firingScript.exec(ctx, q.s.c, []string{q.s.k.Timers(Timers, i), q.s.k.TimerPayloads(i), q.s.k.TimersFiring(i)}, args).AsStrSlice()
	if err == nil && len(vs) != len(es) {
		err = fmt.Errorf("%d answers for %d timers", len(vs), len(es))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("shard: payloads of firing timers of shard %d: %w", i, err)
	}
	payloads, changed = make([][]byte, len(es)), make([]bool, len(es))
	for j, v := range vs {
		switch {
		case v == "x":
			changed[j] = true
		case len(v) > 0 && v[0] == 'p':
			payloads[j] = []byte(v[1:])
		}
	}
	return payloads, changed, nil
}

// firedKeep is how long a fired mark of a generic timer is kept after its
// partition last got one: the crossing rule needs it only until the
// doubling drains.
const firedKeep = 24 * time.Hour

// MarkFired records that each timer of es fired at its deadline, for
// the crossing rule while a doubling drains (see Fired).
func (q QueueTimers) MarkFired(ctx context.Context, es []Entry) error {
	by := make(map[string][]Entry)
	for _, e := range es {
		k := q.s.k.TimersFired(e.ID)
		by[k] = append(by[k], e)
	}
	cmds := make(rueidis.Commands, 0, 2*len(by))
	for k, es := range by {
		h := q.s.c.B().Hset().Key(k).FieldValue()
		for _, e := range es {
			h = h.FieldValue(e.ID, strconv.FormatInt(e.Deadline, 10))
		}
		cmds = append(cmds, h.Build(), q.s.c.B().Pexpire().Key(k).Milliseconds(firedKeep.Milliseconds()).Build())
	}
	for _, r := range q.s.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: mark timers fired: %w", err)
		}
	}
	return nil
}

// Fired returns, for each member, the deadline at which it last
// fired while a doubling drained (0 if none known).
func (q QueueTimers) Fired(ctx context.Context, members []string) ([]int64, error) {
	cmds := make(rueidis.Commands, len(members))
	for j, m := range members {
		cmds[j] = q.s.c.B().Hget().Key(q.s.k.TimersFired(m)).Field(m).Build()
	}
	out := make([]int64, len(members))
	for j, r := range q.s.c.DoMulti(ctx, cmds...) {
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
