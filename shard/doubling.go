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

// A doubling moves the topology from N to 2N shards without copying
// anything: a device stays in shard i or moves to i+N. It runs in three
// steps, each one safe against writers and scanners that lag behind it:
//
//  1. Double raises the layout of every old shard to 2N, then publishes
//     shards = 2N, prev = N, epoch + 1. A scanner reads the layout with every
//     claim, so it checks moved members against their partner shard from the
//     first write placed under 2N on, whether or not it has seen the topology.
//  2. While prev != 0, writers switch as they notice; each reports the epoch
//     it writes with (reportWriter). Once every live writer writes with the
//     current epoch, the owner of each old shard raises the shard's floor to
//     it (writes placed under an older topology are refused from then on, so
//     a writer that lagged, paused or was taken for dead cannot put a moved
//     device back), then counts the moved members left and reports them.
//  3. When every old shard has reported zero moved members after its floor
//     was raised, FinishDoubling clears prev and moves the epoch on.

// doubleScript publishes a doubling: shards = 2N, prev = N, epoch + 1. The
// caller has already raised the layout of every old shard to 2N.
//
// KEYS[1]: topology HASH
// ARGV[1]: the epoch the caller read; ARGV[2]: now, unix ms;
// ARGV[3]: the largest shard count allowed
// Returns: the new epoch, or the error CHANGED (the topology moved since
// the caller read it), DRAINING (prev is not 0) or TOOMANY.
var doubleScript = NewScript(`
local t = redis.call('HMGET', KEYS[1], 'shards', 'prev', 'epoch')
local n, prev, epoch = tonumber(t[1]), tonumber(t[2] or '0'), tonumber(t[3])
if n == nil or epoch ~= tonumber(ARGV[1]) then
  return redis.error_reply('CHANGED topology changed meanwhile')
end
if prev ~= 0 then return redis.error_reply('DRAINING') end
if 2 * n > tonumber(ARGV[3]) then return redis.error_reply('TOOMANY') end
redis.call('HSET', KEYS[1], 'shards', 2 * n, 'prev', n, 'epoch', epoch + 1, 'since', ARGV[2])
return epoch + 1`)

// Double starts a doubling from N to 2N shards and returns the new
// topology. It refuses while a previous doubling drains and above
// MaxShards.
func (s *Store) Double(ctx context.Context, now time.Time) (Topology, error) {
	t, err := s.Topology(ctx)
	if err != nil {
		return Topology{}, err
	}
	if t.Draining() {
		return Topology{}, s.drainingErr(ctx, t)
	}
	if t.Shards*2 > MaxShards {
		return Topology{}, Refuse(ErrTooManyShards, "%d shards is the most sigwatch supports; the topology stays at %d", MaxShards, t.Shards)
	}
	// The layouts go up first: a writer can place a device under 2N only
	// after reading the topology published below, so every claim after
	// such a write sees the layout.
	old := make([]int, t.Shards)
	for i := range old {
		old[i] = i
	}
	if err := s.raiseLayouts(ctx, old, "shards", int64(2*t.Shards)); err != nil {
		return Topology{}, fmt.Errorf("shard: double: raise shard layouts: %w", err)
	}
	if err := s.vetNew(ctx, t.Shards); err != nil {
		return Topology{}, fmt.Errorf("shard: double: %w", err)
	}
	err = doubleScript.exec(ctx, s.c, []string{s.k.Topology()}, []string{strconv.FormatInt(t.Epoch, 10),
		strconv.FormatInt(now.UnixMilli(), 10), strconv.Itoa(MaxShards)}).Error()
	switch {
	case errors.Is(err, ErrDraining):
		if cur, rerr := s.Topology(ctx); rerr == nil {
			return Topology{}, s.drainingErr(ctx, cur)
		}
		return Topology{}, err
	case errors.Is(err, ErrTopologyChanged):
		return Topology{}, fmt.Errorf("%w while doubling (another doubling started?); see `sigwatch shards status`", err)
	case err != nil:
		return Topology{}, fmt.Errorf("shard: double: %w", err)
	}
	return s.Topology(ctx)
}

// drainingErr says which doubling is draining and how far it got.
func (s *Store) drainingErr(ctx context.Context, t Topology) error {
	left := "unknown number of"
	if reports, err := s.DrainStates(ctx); err == nil && len(reports) > 0 {
		var moved int64
		for _, r := range reports {
			if r.Epoch == t.Epoch {
				moved += r.Moved
			}
		}
		left = strconv.FormatInt(moved, 10)
	}
	return Refuse(ErrDraining, "a doubling from %d to %d is still draining (%s moved devices left); wait for it to finish — see `sigwatch shards status`",
		t.Prev, t.Shards, left)
}

// finishScript ends a doubling once every old shard reported itself drained
// for the current epoch: checked with its floor raised, and no moved member
// left in any family. The epoch moves on so that every role notices.
//
// KEYS[1]: topology HASH
// KEYS[2]: drain HASH (shard -> "epoch:moved:floored:ms")
// ARGV[1]: the epoch the caller read; ARGV[2]: now, unix ms
// Returns: 1 if the doubling ended, 0 if an old shard is not drained yet or
// the topology moved on.
var finishScript = NewScript(`
local t = redis.call('HMGET', KEYS[1], 'prev', 'epoch')
local prev, epoch = tonumber(t[1] or '0'), tonumber(t[2])
if prev == 0 or epoch ~= tonumber(ARGV[1]) then return 0 end
for i = 0, prev - 1 do
  local r = redis.call('HGET', KEYS[2], tostring(i))
  if not r then return 0 end
  local e, moved, floored = string.match(r, '^(%d+):(%d+):(%d)')
  if tonumber(e) ~= epoch or tonumber(moved) ~= 0 or floored ~= '1' then return 0 end
end
redis.call('HSET', KEYS[1], 'prev', 0, 'epoch', epoch + 1, 'since', ARGV[2])
redis.call('DEL', KEYS[2])
return 1`)

// FinishDoubling ends the doubling in force at epoch if every old shard has
// reported itself drained for it. It reports whether it ended it.
func (s *Store) FinishDoubling(ctx context.Context, epoch int64, now time.Time) (bool, error) {
	n, err := finishScript.exec(ctx, s.c, []string{s.k.Topology(), s.k.Drain()},
		[]string{strconv.FormatInt(epoch, 10), strconv.FormatInt(now.UnixMilli(), 10)}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("shard: finish doubling: %w", err)
	}
	return n == 1, nil
}

// RaiseFloor refuses, from now on, writes to shard i placed under a
// topology older than epoch.
func (s *Store) RaiseFloor(ctx context.Context, i int, epoch int64) error {
	if err := s.raiseLayouts(ctx, []int{i}, "floor", epoch); err != nil {
		return fmt.Errorf("shard: raise floor of shard %d: %w", i, err)
	}
	return nil
}

// raiseScript raises a numeric HASH field, never lowering it.
//
// KEYS[1]: the HASH; ARGV[1]: field; ARGV[2]: value
// Returns: the field's value after the call.
var raiseScript = NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local v = tonumber(ARGV[2])
if v > cur then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return v
end
return cur`)

// raiseLayouts raises field of the layout of each of shards to v (never
// lowering it), all in one round trip.
func (s *Store) raiseLayouts(ctx context.Context, shards []int, field string, v int64) error {
	arg := strconv.FormatInt(v, 10)
	execs := make([]rueidis.LuaExec, len(shards))
	for j, i := range shards {
		execs[j] = rueidis.LuaExec{Keys: []string{s.k.Layout(i)}, Args: []string{field, arg}}
	}
	for _, r := range raiseScript.execMulti(ctx, s.c, execs...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

// scanCount is the COUNT hint of the ZSCANs that look for moved members.
const scanCount = 1000

// CountMoved counts the members of shard i, in every family, that belong to
// another shard among n: the moved devices an old shard still holds. When
// first is set it stops at the first one found.
func (s *Store) CountMoved(ctx context.Context, i, n int, first bool) (int64, error) {
	var moved int64
	for _, f := range Families {
		err := s.scanMembers(ctx, s.k.Timers(f, i), func(m string) bool {
			if Of(m, n) != i {
				moved++
			}
			return !first || moved == 0
		})
		if err != nil {
			return moved, fmt.Errorf("shard: scan shard %d: %w", i, err)
		}
		if first && moved > 0 {
			return moved, nil
		}
	}
	return moved, nil
}

// scanMembers calls fn with each member of the ZSET at key, a ZSCAN page at
// a time, until fn returns false or the scan ends.
func (s *Store) scanMembers(ctx context.Context, key string, fn func(member string) bool) error {
	cursor := uint64(0)
	for {
		e, err := s.c.Do(ctx, s.c.B().Zscan().Key(key).Cursor(cursor).Count(scanCount).Build()).AsScanEntry()
		if err != nil {
			return err
		}
		// The reply alternates member and score.
		for j := 0; j < len(e.Elements); j += 2 {
			if !fn(e.Elements[j]) {
				return nil
			}
		}
		if cursor = e.Cursor; cursor == 0 {
			return nil
		}
	}
}

// DrainState is what the owner of an old shard last found in it.
type DrainState struct {
	Epoch int64 // the topology epoch the shard was checked under
	Moved int64 // moved members left, over every family
	// Floored says the shard's floor was raised to Epoch before the check,
	// so Moved can only go down: a report with Moved 0 means drained.
	Floored bool
	At      int64 // when, unix ms
}

// Drained reports whether the report says its shard is drained for epoch.
func (r DrainState) Drained(epoch int64) bool { return r.Epoch == epoch && r.Moved == 0 && r.Floored }

// RecordDrain records what the check of old shard i found.
func (s *Store) RecordDrain(ctx context.Context, i int, r DrainState) error {
	floored := "0"
	if r.Floored {
		floored = "1"
	}
	v := strconv.FormatInt(r.Epoch, 10) + ":" + strconv.FormatInt(r.Moved, 10) + ":" + floored + ":" + strconv.FormatInt(r.At, 10)
	field := strconv.Itoa(i)
	return s.hashSet(ctx, s.k.Drain(), field, v, "report drain of shard "+field)
}

// DrainStates returns the drain reports of the doubling in force, by shard.
func (s *Store) DrainStates(ctx context.Context) (map[int]DrainState, error) {
	return hashRecords(ctx, s, s.k.Drain(), "drain reports", func(k, v string) (int, DrainState, bool) {
		i, err := strconv.Atoi(k)
		p := strings.Split(v, ":")
		if err != nil || len(p) != 4 {
			return 0, DrainState{}, false
		}
		var r DrainState
		r.Epoch, _ = strconv.ParseInt(p[0], 10, 64)
		r.Moved, _ = strconv.ParseInt(p[1], 10, 64)
		r.Floored = p[2] == "1"
		r.At, _ = strconv.ParseInt(p[3], 10, 64)
		return i, r, true
	})
}
