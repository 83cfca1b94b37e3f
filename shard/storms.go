package shard

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"
)

// A storm scope ("fleet", or "group:<name>") keeps, under a hash tag of its
// own, the devices of the scope that are lost (a ZSET scored by the
// deadline they were lost at) and the storm's state (a string the alarm
// role changes only by compare-and-set). An index in {meta} lists the
// scopes that had a storm, latest change first.

// stormKey is the key named name of storm scope sc.
func (k Keys) stormKey(sc, name string) string { return k.prefix + ":{storm:" + sc + "}:" + name }

// StormLostKey is the ZSET of the lost devices of storm scope sc.
func (k Keys) StormLostKey(sc string) string { return k.stormKey(sc, "lost") }

// StormStateKey is the storm state of scope sc.
func (k Keys) StormStateKey(sc string) string { return k.stormKey(sc, "state") }

// StormIndex lists the storm scopes that had a storm, scored by the time
// of their latest transition.
func (k Keys) StormIndex() string { return k.meta("storms") }

// stormIndexCap bounds the storm index: the oldest scopes beyond it are
// dropped from the listing (their state stays).
const stormIndexCap = 1000

// StormCount is what a scope's lost set holds after a change: Recent are
// the members lost at or after the window's start, Lost all of them, and
// State the scope's storm state ("" when it never had one).
type StormCount struct {
	Recent, Lost int64
	State        string
}

// StormLoss records that id was lost at deadline in each scope of scopes
// and counts each scope's lost devices from since on, in one round trip.
// It is idempotent: handling a lost event again changes nothing.
func (s *Store) StormLoss(ctx context.Context, scopes []string, id string, deadline, since int64) ([]StormCount, error) {
	b := s.c.B()
	cmds := make(rueidis.Commands, 0, 4*len(scopes))
	for _, sc := range scopes {
		lost := s.k.StormLostKey(sc)
		cmds = append(cmds,
			b.Zadd().Key(lost).ScoreMember().ScoreMember(float64(deadline), id).Build(),
			b.Zcount().Key(lost).Min(strconv.FormatInt(since, 10)).Max("+inf").Build(),
			b.Zcard().Key(lost).Build(),
			b.Get().Key(s.k.StormStateKey(sc)).Build())
	}
	return s.stormCounts(ctx, scopes, cmds, "record storm loss")
}

// StormBack removes id from the lost devices of each scope of scopes and
// counts what remains, in one round trip.
func (s *Store) StormBack(ctx context.Context, scopes []string, id string) ([]StormCount, error) {
	b := s.c.B()
	cmds := make(rueidis.Commands, 0, 4*len(scopes))
	for _, sc := range scopes {
		lost := s.k.StormLostKey(sc)
		cmds = append(cmds,
			b.Zrem().Key(lost).Member(id).Build(),
			b.Zcard().Key(lost).Build(),
			b.Zcard().Key(lost).Build(),
			b.Get().Key(s.k.StormStateKey(sc)).Build())
	}
	return s.stormCounts(ctx, scopes, cmds, "record storm recovery")
}

func (s *Store) stormCounts(ctx context.Context, scopes []string, cmds rueidis.Commands, what string) ([]StormCount, error) {
	out := make([]StormCount, len(scopes))
	rs := s.c.DoMulti(ctx, cmds...)
	for j := range scopes {
		r := rs[4*j : 4*j+4]
		if err := r[0].Error(); err != nil {
			return nil, fmt.Errorf("shard: %s: %w", what, err)
		}
		var err error
		if out[j].Recent, err = r[1].AsInt64(); err == nil {
			out[j].Lost, err = r[2].AsInt64()
		}
		if err == nil {
			out[j].State, err = r[3].ToString()
			if rueidis.IsRedisNil(err) {
				err = nil
			}
		}
		if err != nil {
			return nil, fmt.Errorf("shard: %s: %w", what, err)
		}
	}
	return out, nil
}

// StormLostSince counts the devices of scope sc lost at or after from.
func (s *Store) StormLostSince(ctx context.Context, sc string, from int64) (int64, error) {
	n, err := s.c.Do(ctx, s.c.B().Zcount().Key(s.k.StormLostKey(sc)).Min(strconv.FormatInt(from, 10)).Max("+inf").Build()).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("shard: count storm losses: %w", err)
	}
	return n, nil
}

// StormLostMembers calls fn with the lost devices of scope sc, a page at a
// time.
func (s *Store) StormLostMembers(ctx context.Context, sc string, fn func(ids []string) error) error {
	key := s.k.StormLostKey(sc)
	var cursor uint64
	for {
		e, err := s.c.Do(ctx, s.c.B().Zscan().Key(key).Cursor(cursor).Count(500).Build()).AsScanEntry()
		if err != nil {
			return fmt.Errorf("shard: scan storm members: %w", err)
		}
		ids := make([]string, 0, len(e.Elements)/2)
		for j := 0; j+1 < len(e.Elements); j += 2 {
			ids = append(ids, e.Elements[j])
		}
		if len(ids) > 0 {
			if err := fn(ids); err != nil {
				return err
			}
		}
		if cursor = e.Cursor; cursor == 0 {
			return nil
		}
	}
}

// StormState returns the storm state of scope sc, "" when there is none.
func (s *Store) StormState(ctx context.Context, sc string) (string, error) {
	v, err := s.c.Do(ctx, s.c.B().Get().Key(s.k.StormStateKey(sc)).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("shard: read storm state: %w", err)
	}
	return v, nil
}

// casStringScript replaces a string only if it still holds the value the
// caller read.
//
// KEYS[1]: the string; ARGV[1]: the value read ("" for none); ARGV[2]: the
// new value. Returns 1 if replaced, 0 if it changed meanwhile.
var casStringScript = newScript(`
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1`)

// CompareAndSwapStorm replaces the storm state of scope sc with next if it
// is still old ("" for none), reports whether it did, and lists the scope
// in the storm index at time at.
func (s *Store) CompareAndSwapStorm(ctx context.Context, sc, old, next string, at int64) (bool, error) {
	n, err := casStringScript.exec(ctx, s.c, []string{s.k.StormStateKey(sc)}, []string{old, next}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("shard: write storm state: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	b := s.c.B()
	for _, r := range s.c.DoMulti(ctx,
		b.Zadd().Key(s.k.StormIndex()).ScoreMember().ScoreMember(float64(at), sc).Build(),
		b.Zremrangebyrank().Key(s.k.StormIndex()).Start(0).Stop(-stormIndexCap-1).Build()) {
		if err := r.Error(); err != nil {
			return true, fmt.Errorf("shard: index storm: %w", err)
		}
	}
	return true, nil
}

// StormScopes returns up to limit scopes of the storm index, latest change
// first, with their states ("" if gone).
func (s *Store) StormScopes(ctx context.Context, limit int) (scopes, states []string, err error) {
	scopes, err = s.c.Do(ctx, s.c.B().Zrange().Key(s.k.StormIndex()).Min("+inf").Max("-inf").Byscore().Rev().
		Limit(0, int64(limit)).Build()).AsStrSlice()
	if err != nil {
		return nil, nil, fmt.Errorf("shard: read storm index: %w", err)
	}
	if len(scopes) == 0 {
		return nil, nil, nil
	}
	cmds := make(rueidis.Commands, len(scopes))
	for j, sc := range scopes {
		cmds[j] = s.c.B().Get().Key(s.k.StormStateKey(sc)).Build()
	}
	states = make([]string, len(scopes))
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		v, err := r.ToString()
		if err != nil && !rueidis.IsRedisNil(err) {
			return nil, nil, fmt.Errorf("shard: read storm state: %w", err)
		}
		states[j] = v
	}
	return scopes, states, nil
}

// ForgetStormMember removes id from the lost devices of each scope (a
// device removed through the API).
func (s *Store) ForgetStormMember(ctx context.Context, scopes []string, id string) error {
	_, err := s.StormBack(ctx, scopes, id)
	return err
}
