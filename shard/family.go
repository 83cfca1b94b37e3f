package shard

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"
)

// armScript makes sure a timer fires no later than a given time, without
// ever letting a scanner that is handling the timer right now remove it:
// a timer later than the time is lowered to it, a timer that may be being
// handled (scored at or before the horizon) gets a new score (so the
// scanner's compare-and-remove or compare-and-move leaves it alone), and an
// earlier timer that is not due yet is kept.
//
// KEYS[1]: timer ZSET of one shard; KEYS[2]: its wake key
// ARGV[1]: member; ARGV[2]: at, unix ms
// ARGV[3]: horizon, unix ms: a score at or before it may be claimed now
// ARGV[4]: "1" to add the member when it is absent
// Returns: the member's score after the call, or nil when it is absent.
var armScript = NewScript(wakeLua + `
local at = tonumber(ARGV[2])
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not cur then
  if ARGV[4] ~= '1' then return false end
  redis.call('ZADD', KEYS[1], at, ARGV[1])
  wake(KEYS[2], at)
  return ARGV[2]
end
cur = tonumber(cur)
if cur > at or (cur <= tonumber(ARGV[3]) and cur ~= at) then
  redis.call('ZADD', KEYS[1], at, ARGV[1])
  wake(KEYS[2], at)
  return ARGV[2]
end
if cur == at and cur <= tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], at + 1, ARGV[1])
  return tostring(at + 1)
end
return tostring(cur)`)

// Arm makes the timer of id in shard i of family f fire no later than at
// (see armScript). A score at or before horizon may be being handled by a
// scanner and is always changed; horizon 0 only lowers. With create unset
// an absent timer stays absent. It returns the score after the call, and
// false when the timer is absent.
func (s *Store) Arm(ctx context.Context, f Family, i int, id string, at, horizon int64, create bool) (int64, bool, error) {
	c := "0"
	if create {
		c = "1"
	}
	v, err := armScript.exec(ctx, s.c, []string{s.k.Timers(f, i), s.k.Wake(f, i)},
		[]string{id, strconv.FormatInt(at, 10), strconv.FormatInt(horizon, 10), c}).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("shard: arm %s timer in shard %d: %w", f, i, err)
	}
	return v, true, nil
}

// setScript writes deadlines unconditionally and wakes the shard's loop if
// one lands before the time it sleeps until (see wake.go).
//
// KEYS[1]: timer ZSET of one shard; KEYS[2]: its wake key
// ARGV: score, member pairs
// Returns: 1.
var setScript = NewScript(wakeLua + `
local low
for i = 1, #ARGV, 2 do
  local d = tonumber(ARGV[i])
  if not low or d < low then low = d end
end
for lo = 1, #ARGV, 2000 do
  redis.call('ZADD', KEYS[1], unpack(ARGV, lo, math.min(lo + 1999, #ARGV)))
end
wake(KEYS[2], low)
return 1`)

// Set writes deadlines of shard i unconditionally (ZADD without GT), for
// changes that may move a deadline earlier; a sleeping loop whose head they
// pass is woken.
func (s *Store) Set(ctx context.Context, f Family, i int, es ...Entry) error {
	if len(es) == 0 {
		return nil
	}
	args := make([]string, 0, 2*len(es))
	for _, e := range es {
		args = append(args, strconv.FormatInt(e.Deadline, 10), e.ID)
	}
	if err := setScript.exec(ctx, s.c, []string{s.k.Timers(f, i), s.k.Wake(f, i)}, args).Error(); err != nil {
		return fmt.Errorf("shard: set %s in shard %d: %w", f, i, err)
	}
	return nil
}

// Score returns the deadline of id in shard i, and false if it is absent.
func (s *Store) Score(ctx context.Context, f Family, i int, id string) (int64, bool, error) {
	v, err := s.c.Do(ctx, s.c.B().Zscore().Key(s.k.Timers(f, i)).Member(id).Build()).AsFloat64()
	if rueidis.IsRedisNil(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("shard: score in shard %d: %w", i, err)
	}
	return int64(v), true, nil
}

// Scores returns the deadline of each ids[j] in shard shards[j], in one
// round trip; ok[j] is false where it is absent.
func (s *Store) Scores(ctx context.Context, f Family, shards []int, ids []string) (scores []int64, ok []bool, err error) {
	if len(ids) == 0 {
		return nil, nil, nil
	}
	cmds := make(rueidis.Commands, len(ids))
	for j, id := range ids {
		cmds[j] = s.c.B().Zscore().Key(s.k.Timers(f, shards[j])).Member(id).Build()
	}
	scores, ok = make([]int64, len(ids)), make([]bool, len(ids))
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		v, err := r.AsFloat64()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("shard: scores: %w", err)
		}
		scores[j], ok[j] = int64(v), true
	}
	return scores, ok, nil
}

// Remove deletes id from shard i unconditionally (the device is no longer
// watched).
func (s *Store) Remove(ctx context.Context, f Family, i int, id string) (bool, error) {
	n, err := s.c.Do(ctx, s.c.B().Zrem().Key(s.k.Timers(f, i)).Member(id).Build()).AsInt64()
	if err != nil {
		return false, fmt.Errorf("shard: remove from shard %d: %w", i, err)
	}
	return n == 1, nil
}

// Size returns the number of members of shard i.
func (s *Store) Size(ctx context.Context, f Family, i int) (int64, error) {
	n, errs := s.Sizes(ctx, f, []int{i})
	return n[0], errs[0]
}

// Sizes returns the number of timers in each of shards, in one round trip,
// with each one's error.
func (s *Store) Sizes(ctx context.Context, f Family, shards []int) ([]int64, []error) {
	cmds := make(rueidis.Commands, len(shards))
	for j, i := range shards {
		cmds[j] = s.c.B().Zcard().Key(s.k.Timers(f, i)).Build()
	}
	n := make([]int64, len(shards))
	errs := make([]error, len(shards))
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		if n[j], errs[j] = r.AsInt64(); errs[j] != nil {
			errs[j] = fmt.Errorf("shard: size of shard %d: %w", shards[j], errs[j])
		}
	}
	return n, errs
}

// head returns the earliest entry of shard i, and false if the shard is empty.
func (s *Store) head(ctx context.Context, f Family, i int) (Entry, bool, error) {
	v, err := s.c.Do(ctx, s.headCmd(f, i)).ToArray()
	if err != nil {
		return Entry{}, false, fmt.Errorf("shard: head of shard %d: %w", i, err)
	}
	es, err := parseEntries(v)
	if err != nil || len(es) == 0 {
		return Entry{}, false, err
	}
	return es[0], true, nil
}

// headCmd reads the earliest member of shard i with its score.
func (s *Store) headCmd(f Family, i int) rueidis.Completed {
	return s.c.B().Zrange().Key(s.k.Timers(f, i)).Min("0").Max("0").Withscores().Build()
}
