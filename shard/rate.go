package shard

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// RateType is the STRING holding the theoretical arrival time (TAT, unix
// ms) of the next notification of type typ under the alarm's rate limit;
// typ is the sanitised type of the notification's subject. Every rate key
// carries the hash tag {rate}, so one script reserves across them.
func (k Keys) RateType(typ string) string { return k.prefix + ":{rate}:type:" + typ }

// RateTotal is the TAT of the next notification of any type.
func (k Keys) RateTotal() string { return k.prefix + ":{rate}:total" }

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
var reserveScript = newScript(`
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

// ReserveSlots reserves a send slot for each of len(types) notifications,
// types[j] being the sanitised type of the j-th, at now (unix ms, on
// sigwatch's one clock). per and all are the emission intervals of one type
// and of all types (0: unlimited), whole milliseconds. Slots are returned
// in the order of types.
func (s *Store) ReserveSlots(ctx context.Context, now int64, types []string, per, all time.Duration) ([]int64, error) {
	if len(types) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, len(types)+1)
	keys = append(keys, s.k.RateTotal())
	for _, t := range types {
		keys = append(keys, s.k.RateType(t))
	}
	args := []string{strconv.FormatInt(now, 10), strconv.FormatInt(per.Milliseconds(), 10),
		strconv.FormatInt(all.Milliseconds(), 10)}
	v, err := reserveScript.exec(ctx, s.c, keys, args).ToArray()
	if err == nil && len(v) != len(types) {
		err = fmt.Errorf("got %d slots for %d notifications", len(v), len(types))
	}
	if err != nil {
		return nil, fmt.Errorf("shard: reserve send slots: %w", err)
	}
	out := make([]int64, len(v))
	for j, x := range v {
		if out[j], err = x.AsInt64(); err != nil {
			return nil, fmt.Errorf("shard: reserve send slots: %w", err)
		}
	}
	return out, nil
}
