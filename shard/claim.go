package shard

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// Claimed is the outcome of Claim.
type Claimed struct {
	// Due are the members due at or before the horizon, earliest first.
	Due []Entry
	// Head is the shard's earliest member, due or not, if HasHead.
	Head    Entry
	HasHead bool
	// Layout is the largest shard count writers may place the shard's
	// timers under (0 when never set). A value above the topology a scanner
	// knows says a doubling is being published: the scanner must check moved
	// members against their partner shards before it has seen the topology.
	Layout int
}

// claimScript reads the due members of a shard, fenced by its lease, and
// the largest shard count writers may place the shard's timers under, so
// that a scanner learns of a doubling no later than the first write under it.
// With nothing due it records in the wake key when the loop claims next:
// the head or wakeBy, whichever is earlier (see wake.go); with something
// due the loop claims again at once, and the key goes.
//
// KEYS[1]: timer ZSET of the shard
// KEYS[2]: lease key of the shard
// KEYS[3]: layout HASH of the shard
// KEYS[4]: wake key of the shard
// ARGV[1]: lease value the caller holds
// ARGV[2]: horizon, unix ms: members scored at or below it are due
// ARGV[3]: batch limit
// ARGV[4]: the caller's generation ("" to skip the check)
// ARGV[5]: wakeBy, unix ms; ARGV[6]: how long the wake key is kept, ms
// Returns: {due (id, score, ...), head (id, score) or empty, layout shards
// or 0}, the error NOTOWNER when the caller no longer holds the lease, or
// LOSTDATA when the shard is not vetted under the caller's generation by
// the Redis process serving it now (see generation.go).
var claimScript = NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return redis.error_reply('NOTOWNER lease lost')
end
if ARGV[4] ~= '' then
  local v = redis.call('HMGET', KEYS[3], 'gen', 'run')
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  if v[1] ~= ARGV[4] or v[2] ~= run then
    return redis.error_reply('LOSTDATA shard not vetted under generation ' .. ARGV[4])
  end
end
local due = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[2], 'BYSCORE', 'LIMIT', 0, ARGV[3], 'WITHSCORES')
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local shards = tonumber(redis.call('HGET', KEYS[3], 'shards') or '0')
if #due == 0 then
  local w = tonumber(ARGV[5])
  if head[2] and tonumber(head[2]) < w then w = tonumber(head[2]) end
  redis.call('SET', KEYS[4], string.format('%d', w), 'PX', ARGV[6])
else
  redis.call('DEL', KEYS[4])
end
return {due, head, shards}`)

// Claim reads up to limit members of shard i due at or before horizon, the
// shard's head and its layout. It fails with ErrNotOwner unless lease is
// still the shard's lease. When nothing is due the caller is to sleep until
// the head or wakeBy, whichever is earlier: a write that lands earlier
// wakes it (see Wakes).
func (s *Store) Claim(ctx context.Context, f Family, i int, lease Lease, horizon int64, limit int, wakeBy time.Time) (Claimed, error) {
	keep := time.Until(wakeBy) + wakeKeep
	v, err := claimScript.exec(ctx, s.c, []string{s.k.Timers(f, i), s.k.Owner(i), s.k.Layout(i), s.k.Wake(f, i)},
		[]string{lease.Value, strconv.FormatInt(horizon, 10), strconv.Itoa(limit), s.Generation(),
			strconv.FormatInt(wakeBy.UnixMilli(), 10), strconv.FormatInt(keep.Milliseconds(), 10)}).tuple(3)
	if err != nil {
		s.lossSeen(err)
		return Claimed{}, fmt.Errorf("shard: claim shard %d: %w", i, err)
	}
	var c Claimed
	dueRaw, _ := v[0].ToArray()
	headRaw, _ := v[1].ToArray()
	layout, _ := v[2].AsInt64()
	c.Layout = int(layout)
	if c.Due, err = parseEntries(dueRaw); err != nil {
		return Claimed{}, fmt.Errorf("shard: claim shard %d: %w", i, err)
	}
	hs, err := parseEntries(headRaw)
	if err != nil {
		return Claimed{}, fmt.Errorf("shard: claim shard %d: %w", i, err)
	}
	if len(hs) > 0 {
		c.Head, c.HasHead = hs[0], true
	}
	return c, nil
}

// Move is a deferred entry: if its score is still From, it becomes To.
type Move struct {
	ID   string
	From int64
	To   int64
}

// Settled is the outcome of Settle.
type Settled struct {
	Removed int
	Moved   int
	// Revived are fired entries whose score changed after the claim: a
	// signal landed in between, so they stay watched at their new deadline.
	Revived []Entry
}

// settleScript finishes a claimed batch: compare-and-remove for fired
// members, compare-and-move for deferred ones, fenced by the lease.
//
// KEYS[1]: timer ZSET of the shard
// KEYS[2]: lease key of the shard
// KEYS[3]: optional payload HASH of the shard: a removed member's payload
// goes with it
// KEYS[4]: with KEYS[3], the firing marks of the shard: every fired
// member's is cleared
// ARGV[1]: lease value the caller holds
// ARGV[2]: number of fired members n
// ARGV[3 .. 2+2n]: fired id, claimed score pairs (removed if unchanged)
// ARGV[3+2n ..]:   deferred id, claimed score, new score triples (moved if unchanged)
// Returns: {removed count, moved count, revived (id, score, ...)} where revived
// are fired members whose score changed after the claim (a reset landed),
// or the error NOTOWNER when the caller no longer holds the lease.
var settleScript = NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return redis.error_reply('NOTOWNER lease lost')
end
local n = tonumber(ARGV[2])
local removed, moved, revived = 0, 0, {}
-- In chunks, so that unpack stays within Lua's stack whatever the batch.
for c = 0, n - 1, 500 do
  local ids, want = {}, {}
  for j = c, math.min(n, c + 500) - 1 do
    ids[#ids+1] = ARGV[3 + 2*j]
    want[#want+1] = ARGV[4 + 2*j]
  end
  local cur = redis.call('ZMSCORE', KEYS[1], unpack(ids))
  local gone = {}
  for k = 1, #ids do
    if cur[k] then
      if tonumber(cur[k]) == tonumber(want[k]) then
        gone[#gone+1] = ids[k]
      else
        revived[#revived+1] = ids[k]
        revived[#revived+1] = cur[k]
      end
    end
  end
  if #gone > 0 then
    removed = removed + redis.call('ZREM', KEYS[1], unpack(gone))
    if KEYS[3] then redis.call('HDEL', KEYS[3], unpack(gone)) end
  end
  if KEYS[4] then redis.call('HDEL', KEYS[4], unpack(ids)) end
end
for i = 3 + 2*n, #ARGV, 3 do
  local cur = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if cur and tonumber(cur) == tonumber(ARGV[i+1]) then
    redis.call('ZADD', KEYS[1], 'GT', ARGV[i+2], ARGV[i])
    moved = moved + 1
  end
end
return {removed, moved, revived}`)

// Settle finishes a claimed batch of shard i: each fired entry is removed only
// if its score is still the claimed one (a reset that landed in between
// survives), and each move is applied only if the score is unchanged. It
// fails with ErrNotOwner, changing nothing, unless lease is still held.
func (s *Store) Settle(ctx context.Context, f Family, i int, lease Lease, fired []Entry, moves []Move) (Settled, error) {
	args := make([]string, 0, 2+2*len(fired)+3*len(moves))
	args = append(args, lease.Value, strconv.Itoa(len(fired)))
	for _, e := range fired {
		args = append(args, e.ID, strconv.FormatInt(e.Deadline, 10))
	}
	for _, m := range moves {
		args = append(args, m.ID, strconv.FormatInt(m.From, 10), strconv.FormatInt(m.To, 10))
	}
	keys := []string{s.k.Timers(f, i), s.k.Owner(i)}
	if f == Timers {
		keys = append(keys, s.k.TimerPayloads(i), s.k.TimersFiring(i))
	}
	v, err := settleScript.exec(ctx, s.c, keys, args).tuple(3)
	if err != nil {
		return Settled{}, fmt.Errorf("shard: settle shard %d: %w", i, err)
	}
	var out Settled
	removed, _ := v[0].AsInt64()
	moved, _ := v[1].AsInt64()
	out.Removed, out.Moved = int(removed), int(moved)
	rev, _ := v[2].ToArray()
	if out.Revived, err = parseEntries(rev); err != nil {
		return Settled{}, fmt.Errorf("shard: settle shard %d: %w", i, err)
	}
	return out, nil
}
