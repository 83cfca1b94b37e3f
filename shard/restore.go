package shard

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// The writes a restore after a loss makes (see generation.go): they put
// back what the durable registry knows, under a topology no lower than
// any seen, before the shards are vetted again.

// RestoreTopology writes t as the topology in force, whatever Redis holds
// now. While t drains, the old shards' layouts are raised to t.Shards, as
// a doubling does, so their claims check moved members.
func (s *Store) RestoreTopology(ctx context.Context, t Topology) error {
	if err := ValidCount(t.Shards); err != nil {
		return fmt.Errorf("shard: restore topology: %w", err)
	}
	if t.Prev != 0 {
		old := make([]int, t.Prev)
		for i := range old {
			old[i] = i
		}
		if err := s.raiseLayouts(ctx, old, "shards", int64(t.Shards)); err != nil {
			return fmt.Errorf("shard: restore topology: %w", err)
		}
	}
	err := s.c.Do(ctx, s.c.B().Hset().Key(s.k.Topology()).FieldValue().
		FieldValue("shards", strconv.Itoa(t.Shards)).FieldValue("prev", strconv.Itoa(t.Prev)).
		FieldValue("epoch", strconv.FormatInt(t.Epoch, 10)).FieldValue("since", strconv.FormatInt(t.Since, 10)).Build()).Error()
	if err != nil {
		return fmt.Errorf("shard: restore topology: %w", err)
	}
	return nil
}

// outageScript records an outage in the outage list.
//
// KEYS[1]: outage list; ARGV[1]: start; ARGV[2]: end (unix ms); ARGV[3]: cap
var outageScript = NewScript(recordOutage + `
return record(KEYS[1], ARGV[1], ARGV[2], 0, tonumber(ARGV[3]))`)

// AddOutage records o in the ingest outage list: the scanners' outage rule
// (invariant 6) then gives every device whose silence overlaps it a full
// threshold from its end.
func (w Watermarks) AddOutage(ctx context.Context, o Outage) error {
	err := outageScript.exec(ctx, w.s.c, []string{w.s.k.Outages()},
		[]string{strconv.FormatInt(o.Start, 10), strconv.FormatInt(o.End, 10), strconv.Itoa(OutagesCap)}).Error()
	if err != nil {
		return fmt.Errorf("shard: record outage: %w", err)
	}
	return nil
}

// Restored is a device as the durable registry knows it.
type Restored struct {
	ID, Type     string
	Group        string        // "" if none
	Threshold    time.Duration // per-device override, 0 if none
	LostDeadline int64         // 0 if not lost
	LostAt       int64
}

// RestoreRegistry writes the registry entries, lost marks, threshold
// overrides and groups (with their membership) of devs, in one round trip.
func (s *Store) RestoreRegistry(ctx context.Context, devs []Restored) error {
	b := s.c.B()
	types := make([]string, len(devs))
	for j, d := range devs {
		types[j] = d.Type
	}
	codes, err := s.typeCodesOf(ctx, types)
	if err != nil {
		return err
	}
	var cmds rueidis.Commands
	overrides := false
	for _, d := range devs {
		if d.Type != "" {
			cmds = append(cmds, b.Hset().Key(s.k.Registry(d.ID)).FieldValue().FieldValue(d.ID, codes[d.Type]).Build())
		}
		if d.Group != "" {
			cmds = append(cmds, b.Sadd().Key(s.k.GroupMembers(d.Group)).Member(d.ID).Build(),
				b.Hset().Key(s.k.Group(d.ID)).FieldValue().FieldValue(d.ID, d.Group).Build())
		}
		if d.LostDeadline != 0 {
			cmds = append(cmds, b.Hset().Key(s.k.Lost(d.ID)).FieldValue().FieldValue(d.ID, lostMark(d.LostDeadline, d.LostAt)).Build())
		}
		if d.Threshold > 0 {
			overrides = true
			cmds = append(cmds, b.Hset().Key(s.k.Overrides()).FieldValue().FieldValue(d.ID, strconv.FormatInt(d.Threshold.Milliseconds(), 10)).Build())
		}
	}
	if overrides {
		cmds = append(cmds, b.Incr().Key(s.k.OverridesVersion()).Build())
	}
	for _, r := range s.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: restore registry: %w", err)
		}
	}
	return nil
}

// dropFiredScript removes a fired device's entry if its score is no later
// than the deadline it was lost at, and returns the score left.
//
// KEYS[1]: deadline ZSET of a shard
// ARGV[1]: device id; ARGV[2]: the deadline it was lost at
// Returns: the score left, or nil when the shard holds no entry.
var dropFiredScript = NewScript(`
local sc = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not sc then return false end
if tonumber(sc) <= tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return false
end
return sc`)

// DropFired removes what a rollback brought back of devices already
// declared lost: each entry of lost (ID, the deadline it was lost at) is
// removed from the shards t locates it in if scored no later than that
// deadline. It returns, per entry, the latest score left (0 if none): a
// later score is a signal stored after the device was lost.
func (s *Store) DropFired(ctx context.Context, t Topology, lost []Entry) ([]int64, error) {
	var execs []rueidis.LuaExec
	var owner []int
	for j, e := range lost {
		for _, i := range t.Locate(e.ID) {
			execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.Timers(Deadlines, i)},
				Args: []string{e.ID, strconv.FormatInt(e.Deadline, 10)}})
			owner = append(owner, j)
		}
	}
	left := make([]int64, len(lost))
	for k, r := range dropFiredScript.execMulti(ctx, s.c, execs...) {
		v, err := r.ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("shard: drop fired entries: %w", err)
		}
		sc, _ := strconv.ParseFloat(v, 64)
		left[owner[k]] = max(left[owner[k]], int64(sc))
	}
	return left, nil
}
