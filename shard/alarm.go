package shard

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"
)

// Alarm returns the key layout of the alarm's repeat timers: a second
// sharded delay queue under prefix ":alarm", with its own topology, leases
// and scanners, so that the alarm role scans it independently of the
// deadline scanners.
func (k Keys) Alarm() Keys { return NewKeys(k.prefix + ":alarm") }

// Mutes is the HASH of alarm mutes (mute id -> JSON).
func (k Keys) Mutes() string { return k.meta("mutes") }

// Parts is the number of registry partitions (see Part).
const Parts = registryParts

// PartKeyAt is PartKey for partition p, for scans over every partition.
func (k Keys) PartKeyAt(p int, name string) string {
	return k.prefix + ":{r" + strconv.Itoa(p) + "}:" + name
}

// armScript makes sure a timer fires no later than a given time, without
// ever letting a scanner that is handling the timer right now remove it:
// a timer later than the time is lowered to it, a timer that may be being
// handled (scored at or before the horizon) gets a new score (so the
// scanner's compare-and-remove or compare-and-move leaves it alone), and an
// earlier timer that is not due yet is kept.
//
// KEYS[1]: timer ZSET of one shard
// ARGV[1]: member; ARGV[2]: at, unix ms
// ARGV[3]: horizon, unix ms: a score at or before it may be claimed now
// ARGV[4]: "1" to add the member when it is absent
// Returns: the member's score after the call, or nil when it is absent.
var armScript = rueidis.NewLuaScript(`
local at = tonumber(ARGV[2])
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not cur then
  if ARGV[4] ~= '1' then return false end
  redis.call('ZADD', KEYS[1], at, ARGV[1])
  return ARGV[2]
end
cur = tonumber(cur)
if cur > at or (cur <= tonumber(ARGV[3]) and cur ~= at) then
  redis.call('ZADD', KEYS[1], at, ARGV[1])
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
	v, err := armScript.Exec(ctx, s.c, []string{s.k.Timers(f, i)},
		[]string{id, strconv.FormatInt(at, 10), strconv.FormatInt(horizon, 10), c}).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("shard: arm %s timer in shard %d: %w", f, i, err)
	}
	return v, true, nil
}
