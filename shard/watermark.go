package shard

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// The ingest watermark is the time up to which ingest is known to have been
// consuming; scanners fire only up to it (invariant 6). Each ingest member
// reports its own (AdvanceMember) and the global one follows what the
// members together consumed; a jump larger than the outage threshold is
// recorded as an outage.

// Watermarks is the ingest watermark of an installation: how far ingest has
// consumed, its outages and members, and the notices that it moved or is
// wanted. Ingest writes it; the engine, the scanner, the timers and the
// guard read it.
type Watermarks struct{ s *Store }

// Watermarks returns the ingest watermark's operations.
func (s *Store) Watermarks() Watermarks { return Watermarks{s} }

// Outage is a gap in the ingest watermark: ingest was not known to be
// consuming between Start and End (unix ms).
type Outage struct {
	Start int64 `json:"start"`
	End   int64 `json:"end"`
	// GraceFrom, when set, is when the broker was back after a restart:
	// from then to End devices were given time to reconnect (the
	// reconnect grace, or longer when a gap of ingest's own followed).
	GraceFrom int64 `json:"grace_from,omitempty"`
}

// OutagesCap bounds the outage list whatever its outages' age: far more
// than ever recorded while a threshold runs (each outage is a watermark
// jump of several seconds, and touching ones are merged). Reaching it
// drops the oldest, and the call that did says so.
const OutagesCap = 100_000

// recordOutage is the Lua that records the outage [cur, new] (unix ms, as
// strings) in the list at key: it merges it into the last outage if the two
// overlap or touch, else appends; it drops outages that ended more than
// keep ms before new (keep 0: none), and the oldest beyond cap. The list
// thus only grows or changes at its end and shrinks at its start. grace
// (a string, "0": none) is when a reconnect grace in the outage began (it
// runs at least to the outage's end, which a later gap may push further);
// a merged outage keeps the grace of the one that ends it, else the one it
// has. An entry is "start:end" or "start:end:grace". It returns how many
// outages the cap dropped.
const recordOutage = `
local function entry(s, e, g)
  if g > 0 then return string.format('%d:%d:%d', s, e, g) end
  return string.format('%d:%d', s, e)
end
local function record(key, cur, new, keep, cap, grace)
  local s, e, g = tonumber(cur), tonumber(new), tonumber(grace or '0') or 0
  local last = redis.call('LINDEX', key, -1)
  local ls, le, lg
  if last then ls, le, lg = string.match(last, '^(%d+):(%d+):?(%d*)$') end
  if le and tonumber(le) >= s and tonumber(ls) <= e then
    -- The grace of the outage that ends the merged one, else the one it
    -- holds: from grace on, devices had at least the reconnect grace.
    le, lg = tonumber(le), tonumber(lg) or 0
    if e < le or (e == le and lg > g) or g == 0 then g = lg end
    redis.call('LSET', key, -1, entry(math.min(s, tonumber(ls)), math.max(e, le), g))
  else
    redis.call('RPUSH', key, entry(s, e, g))
  end
  if keep > 0 then
    for _ = 1, 64 do
      local head = redis.call('LINDEX', key, 0)
      local he = head and string.match(head, '^%d+:(%d+)')
      if head == nil or (he and tonumber(he) >= e - keep) then break end
      redis.call('LPOP', key)
    end
  end
  local n = redis.call('LLEN', key)
  if n > cap then
    redis.call('LTRIM', key, n - cap, -1)
    return n - cap
  end
  return 0
end
`

// watermarkScript moves the ingest watermark forward and records a gap
// larger than the outage threshold as an outage.
//
// KEYS[1]: watermark key; KEYS[2]: outage list
// ARGV[1]: new watermark, unix ms; ARGV[2]: outage threshold, ms;
// ARGV[3]: outages cap; ARGV[4]: the channel a rise is announced on
// Returns: the watermark after the call.
var watermarkScript = NewScript(recordOutage + `
local cur = redis.call('GET', KEYS[1])
local new = tonumber(ARGV[1])
if cur and new <= tonumber(cur) then return cur end
if cur and new - tonumber(cur) > tonumber(ARGV[2]) then
  record(KEYS[2], cur, ARGV[1], 0, tonumber(ARGV[3]), '0')
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[4], ARGV[1])
return ARGV[1]`)

// Advance moves the ingest watermark forward to ms. A jump larger
// than gap is recorded as an outage. It keeps outages up to OutagesCap;
// ingest members use AdvanceMember, which also drops them by age.
func (w Watermarks) Advance(ctx context.Context, ms int64, gap time.Duration) (int64, error) {
	v, err := watermarkScript.exec(ctx, w.s.c, []string{w.s.k.Watermark(), w.s.k.Outages()},
		[]string{strconv.FormatInt(ms, 10), strconv.FormatInt(gap.Milliseconds(), 10), strconv.Itoa(OutagesCap), w.s.k.WatermarkMoves()}).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("shard: advance watermark: %w", err)
	}
	return v, nil
}

// Read returns the ingest watermark (0 if ingest never ran) and the
// recorded outages, oldest first.
func (w Watermarks) Read(ctx context.Context) (int64, []Outage, error) {
	b := w.s.c.B()
	rs := w.s.c.DoMulti(ctx,
		b.Get().Key(w.s.k.Watermark()).Build(),
		b.Lrange().Key(w.s.k.Outages()).Start(0).Stop(-1).Build())
	wm, err := rs[0].AsInt64()
	if err != nil && !rueidis.IsRedisNil(err) {
		return 0, nil, fmt.Errorf("shard: read watermark: %w", err)
	}
	raw, err := rs[1].AsStrSlice()
	if err != nil {
		return 0, nil, fmt.Errorf("shard: read outages: %w", err)
	}
	outs := make([]Outage, 0, len(raw))
	for _, r := range raw {
		if o, ok := parseOutage(r); ok {
			outs = append(outs, o)
		}
	}
	return wm, outs, nil
}

// parseOutage reads an entry of the outage list: "start:end", or
// "start:end:grace" (see recordOutage).
func parseOutage(r string) (Outage, bool) {
	f := strings.Split(r, ":")
	if len(f) != 2 && len(f) != 3 {
		return Outage{}, false
	}
	var v [3]int64
	for j, x := range f {
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return Outage{}, false
		}
		v[j] = n
	}
	return Outage{Start: v[0], End: v[1], GraceFrom: v[2]}, true
}

// Tail returns the ingest watermark (0 if ingest never ran), the
// number of recorded outages and the last k of them, oldest first, in one
// round trip: the outage list can hold up to OutagesCap entries, and a
// view of the fleet wants only the latest. With k 1 it is enough for a
// reader that keeps the outages to tell whether they changed (the list only
// grows at its end and is trimmed at its start) without reading them all
// again. An entry that does not parse is left out, as Watermark skips it.
func (w Watermarks) Tail(ctx context.Context, k int) (wm, n int64, last []Outage, err error) {
	b := w.s.c.B()
	rs := w.s.c.DoMulti(ctx,
		b.Get().Key(w.s.k.Watermark()).Build(),
		b.Llen().Key(w.s.k.Outages()).Build(),
		b.Lrange().Key(w.s.k.Outages()).Start(int64(-k)).Stop(-1).Build())
	if wm, err = rs[0].AsInt64(); err != nil && !rueidis.IsRedisNil(err) {
		return 0, 0, nil, fmt.Errorf("shard: read watermark: %w", err)
	}
	if n, err = rs[1].AsInt64(); err != nil {
		return 0, 0, nil, fmt.Errorf("shard: read outages: %w", err)
	}
	raw, err := rs[2].AsStrSlice()
	if err != nil {
		return 0, 0, nil, fmt.Errorf("shard: read outages: %w", err)
	}
	last = make([]Outage, 0, len(raw))
	for _, r := range raw {
		if o, ok := parseOutage(r); ok {
			last = append(last, o)
		}
	}
	return wm, n, last, nil
}

// Member names one ingest consumer. Members with the same Group share one
// MQTT subscription ($share/<group>/...) and split the stream; a member with
// no group consumes the whole stream.
type Member struct {
	Group string
	ID    string
}

func (m Member) field() string { return m.Group + "|" + m.ID }

// memberScript records one ingest member's watermark and moves the global
// watermark to what the members together are known to have consumed:
// members of one shared subscription group split the stream, so the group
// has consumed up to its slowest member (min); a member outside any group
// consumes everything itself. The global watermark is the best of those
// (max). Members silent for longer than the timeout are dropped, so a dead
// member holds firing back for at most that long, and the gap it leaves is
// recorded as an outage like any other. Outages are kept while they can
// still overlap a silence window (see Outages.Keep). A member whose
// connection to the broker broke since its last report asks for an outage
// through a given time (Outages.Through): it runs from that last report,
// or from the global watermark if the other members vouched for later, and
// is recorded before the watermark moves past it.
//
// KEYS[1]: member HASH ("group|id" -> ms)
// KEYS[2]: global watermark
// KEYS[3]: outage list
// ARGV[1]: member field "group|id"; ARGV[2]: member watermark, unix ms
// ARGV[3]: now, unix ms; ARGV[4]: member timeout, ms (0: never drop)
// ARGV[5]: outage threshold, ms; ARGV[6]: outages kept for, ms (0: until
// the cap); ARGV[7]: outages cap; ARGV[8]: the end of the outage the
// member asks for, unix ms (0: none); ARGV[9]: when its reconnect grace
// began (0: none); ARGV[10]: the channel a rise is announced on
// Returns: {the global watermark after the call (false if none), outages
// the cap dropped}.
var memberScript = NewScript(recordOutage + `
local prev = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local now, timeout = tonumber(ARGV[3]), tonumber(ARGV[4])
local keep, cap = tonumber(ARGV[6]), tonumber(ARGV[7])
local all = redis.call('HGETALL', KEYS[1])
local best, groups = nil, {}
for i = 1, #all, 2 do
  local field, wm = all[i], tonumber(all[i+1])
  if timeout > 0 and wm < now - timeout then
    redis.call('HDEL', KEYS[1], field)
  else
    local group = string.match(field, '^(.-)|')
    if group == nil or group == '' then
      if best == nil or wm > best then best = wm end
    elseif groups[group] == nil or wm < groups[group] then
      groups[group] = wm
    end
  end
end
for _, wm in pairs(groups) do
  if best == nil or wm > best then best = wm end
end
local cur = redis.call('GET', KEYS[2])
local dropped = 0
local through = tonumber(ARGV[8])
if through > 0 and (prev or cur) then
  local from = tonumber(prev or cur)
  if cur and tonumber(cur) > from then from = tonumber(cur) end
  if through > from then
    dropped = record(KEYS[3], string.format('%d', from), ARGV[8], keep, cap, ARGV[9])
  end
end
if best == nil then return {cur, dropped} end
if cur and best <= tonumber(cur) then return {cur, dropped} end
local new = string.format('%d', best)
if cur and best - tonumber(cur) > tonumber(ARGV[5]) then
  dropped = dropped + record(KEYS[3], cur, new, keep, cap, '0')
end
redis.call('SET', KEYS[2], new)
redis.call('PUBLISH', ARGV[10], new)
return {new, dropped}`)

// Outages says what AdvanceMember records as an outage and how long it
// keeps one.
type Outages struct {
	// Gap: a jump of the global watermark larger than this is an outage.
	Gap time.Duration
	// Keep: an outage is dropped once the watermark is more than this past
	// its end. An outage matters while a deadline's silence window can
	// overlap it, so Keep is the longest threshold in force plus how far
	// behind the watermark a scanner may fall; 0 keeps up to OutagesCap.
	Keep time.Duration
	// Through, when not 0, asks for an outage through this time (unix
	// ms): the member's connection to the broker broke since its last
	// report. It begins at that report, or at the global watermark if that
	// is later. GraceFrom, when not 0, is when the reconnect grace at its
	// end began.
	Through, GraceFrom int64
}

// AdvanceMember records that member has consumed everything up to ms and
// moves the global watermark accordingly (see memberScript), recording a
// jump as an outage as o says. It returns the global watermark (0 if none)
// and how many outages OutagesCap dropped, which is not meant to happen.
func (w Watermarks) AdvanceMember(ctx context.Context, m Member, ms int64, now time.Time, timeout time.Duration, o Outages) (wm, dropped int64, err error) {
	vs, err := memberScript.exec(ctx, w.s.c, []string{w.s.k.Members(), w.s.k.Watermark(), w.s.k.Outages()},
		[]string{m.field(), strconv.FormatInt(ms, 10), strconv.FormatInt(now.UnixMilli(), 10),
			strconv.FormatInt(timeout.Milliseconds(), 10), strconv.FormatInt(o.Gap.Milliseconds(), 10),
			strconv.FormatInt(o.Keep.Milliseconds(), 10), strconv.Itoa(OutagesCap),
			strconv.FormatInt(o.Through, 10), strconv.FormatInt(o.GraceFrom, 10), w.s.k.WatermarkMoves()}).tuple(2)
	if err != nil {
		return 0, 0, fmt.Errorf("shard: advance watermark of %s: %w", m.ID, err)
	}
	if wm, err = vs[0].AsInt64(); err != nil && !rueidis.IsRedisNil(err) {
		return 0, 0, fmt.Errorf("shard: advance watermark of %s: %w", m.ID, err)
	}
	dropped, _ = vs[1].AsInt64()
	return wm, dropped, nil
}

// Join records that member m takes part in its group from ms on:
// nothing was routed to it before ms, so the group has consumed up to ms as
// far as m is concerned, and its watermark waits for m from then on. A
// member already recorded keeps its watermark: one that restarts after a
// crash must not vouch for what its last run dropped.
func (w Watermarks) Join(ctx context.Context, m Member, ms int64) error {
	cmd := w.s.c.B().Hsetnx().Key(w.s.k.Members()).Field(m.field()).Value(strconv.FormatInt(ms, 10)).Build()
	if err := w.s.c.Do(ctx, cmd).Error(); err != nil {
		return fmt.Errorf("shard: join ingest member %s: %w", m.ID, err)
	}
	return nil
}

// Leave removes a member that stopped consuming on purpose, so its
// group's watermark no longer waits for it.
func (w Watermarks) Leave(ctx context.Context, m Member) error {
	return w.s.hashDelete(ctx, w.s.k.Members(), m.field(), "leave ingest member "+m.ID)
}

// Members returns every ingest member's watermark, keyed "group|id".
func (w Watermarks) Members(ctx context.Context) (map[string]int64, error) {
	m, err := w.s.c.Do(ctx, w.s.c.B().Hgetall().Key(w.s.k.Members()).Build()).AsIntMap()
	if err != nil {
		return nil, fmt.Errorf("shard: read ingest members: %w", err)
	}
	return m, nil
}
