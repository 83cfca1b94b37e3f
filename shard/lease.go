package shard

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Lease is a held lease on one shard. Value is "owner|token"; the token
// grows with every acquisition, so an older holder can never pass for a
// newer one.
type Lease struct {
	Shard int
	Value string
}

// Token returns the fencing token of the lease.
func (l Lease) Token() int64 {
	j := strings.LastIndexByte(l.Value, '|')
	t, _ := strconv.ParseInt(l.Value[j+1:], 10, 64)
	return t
}

// acquireScript takes a free lease and hands out a new fencing token.
//
// KEYS[1]: lease key of the shard
// KEYS[2]: fencing counter of the shard
// ARGV[1]: owner id (unique per process)
// ARGV[2]: ttl, ms
// Returns: the lease value "owner|token", or nil when another owner holds it.
var acquireScript = NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local v = ARGV[1] .. '|' .. redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
return v`)

// Owner is the id of the process holding the lease, as shown to users.
func (l Lease) Owner() string {
	return l.Value[:max(strings.LastIndexByte(l.Value, '|'), 0)]
}

// Acquire takes shard i's lease for owner if it is free. ok is false when
// another owner holds it.
func (s *Store) Acquire(ctx context.Context, i int, owner string, ttl time.Duration) (l Lease, ok bool, err error) {
	v, err := acquireScript.exec(ctx, s.c, []string{s.k.Owner(i), s.k.Fence(i)},
		[]string{owner, strconv.FormatInt(ttl.Milliseconds(), 10)}).ToString()
	if rueidis.IsRedisNil(err) {
		return Lease{}, false, nil
	}
	if err != nil {
		return Lease{}, false, fmt.Errorf("shard: acquire lease of shard %d: %w", i, err)
	}
	return Lease{Shard: i, Value: v}, true, nil
}

// renewScript extends a lease the caller still holds.
//
// KEYS[1]: lease key; ARGV[1]: lease value; ARGV[2]: ttl, ms
// Returns: 1 if renewed, 0 if the lease is gone or someone else's.
var renewScript = NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`)

// renew extends l. It returns ErrNotOwner if l was lost.
func (s *Store) renew(ctx context.Context, l Lease, ttl time.Duration) error {
	return s.RenewAll(ctx, []Lease{l}, ttl)[0]
}

// RenewAll extends every lease of ls in one round trip, and returns each
// one's outcome: nil, ErrNotOwner if it was lost, or the failure.
func (s *Store) RenewAll(ctx context.Context, ls []Lease, ttl time.Duration) []error {
	execs := make([]rueidis.LuaExec, len(ls))
	ms := strconv.FormatInt(ttl.Milliseconds(), 10)
	for j, l := range ls {
		execs[j] = rueidis.LuaExec{Keys: []string{s.k.Owner(l.Shard)}, Args: []string{l.Value, ms}}
	}
	errs := make([]error, len(ls))
	for j, r := range renewScript.execMulti(ctx, s.c, execs...) {
		n, err := r.AsInt64()
		switch {
		case err != nil:
			errs[j] = fmt.Errorf("shard: renew lease of shard %d: %w", ls[j].Shard, err)
		case n != 1:
			errs[j] = fmt.Errorf("shard: renew lease of shard %d: %w", ls[j].Shard, ErrNotOwner)
		}
	}
	return errs
}

// releaseScript drops a lease the caller still holds.
//
// KEYS[1]: lease key; ARGV[1]: lease value
// Returns: 1 if released, 0 otherwise.
var releaseScript = NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// Release gives l up so another replica can take the shard at once.
func (s *Store) Release(ctx context.Context, l Lease) error {
	if err := releaseScript.exec(ctx, s.c, []string{s.k.Owner(l.Shard)}, []string{l.Value}).Error(); err != nil {
		return fmt.Errorf("shard: release lease of shard %d: %w", l.Shard, err)
	}
	return nil
}

// Owner returns the lease value of shard i ("" when free).
func (s *Store) Owner(ctx context.Context, i int) (string, error) {
	v, err := s.c.Do(ctx, s.c.B().Get().Key(s.k.Owner(i)).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("shard: owner of shard %d: %w", i, err)
	}
	return v, nil
}

// Heartbeat registers a scanner replica as alive until now+ttl and returns
// the live replicas, sorted. Scanner replicas share the shards by Assign
// over this list.
func (s *Store) Heartbeat(ctx context.Context, replica string, now time.Time, ttl time.Duration) ([]string, error) {
	b := s.c.B()
	key := s.k.Scanners()
	rs := s.c.DoMulti(ctx,
		b.Zadd().Key(key).ScoreMember().ScoreMember(float64(now.Add(ttl).UnixMilli()), replica).Build(),
		b.Zremrangebyscore().Key(key).Min("-inf").Max(strconv.FormatInt(now.UnixMilli(), 10)).Build(),
		b.Zrange().Key(key).Min("0").Max("-1").Build())
	for _, r := range rs[:2] {
		if err := r.Error(); err != nil {
			return nil, fmt.Errorf("shard: scanner heartbeat: %w", err)
		}
	}
	live, err := rs[2].AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("shard: scanner heartbeat: %w", err)
	}
	// The ZSET is ordered by expiry, which changes with every heartbeat;
	// Assign needs an order every replica agrees on.
	slices.Sort(live)
	return live, nil
}

// Leave removes a scanner replica from the live set.
func (s *Store) Leave(ctx context.Context, replica string) error {
	if err := s.c.Do(ctx, s.c.B().Zrem().Key(s.k.Scanners()).Member(replica).Build()).Error(); err != nil {
		return fmt.Errorf("shard: scanner leave: %w", err)
	}
	return nil
}
