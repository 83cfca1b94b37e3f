package shard

import (
	"context"
	"crypto/sha1"
	"encoding/hex"

	"github.com/redis/rueidis"
)

// script is a Lua script that can also run for many keys in one round trip.
// rueidis's Lua.ExecMulti loads the script (SCRIPT LOAD) before every
// batch, one more sequential round trip per call; ExecMulti here sends
// EVALSHA at once and falls back to EVAL only for the calls that found the
// script missing (a restarted or flushed Redis).
type script struct {
	*rueidis.Lua
	src, sha string
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{Lua: rueidis.NewLuaScript(src), src: src, sha: hex.EncodeToString(sum[:])}
}

// ExecMulti runs the script once per exec, all in one round trip (two when
// Redis does not have the script yet). Results are in the order of execs.
func (s *script) ExecMulti(ctx context.Context, c rueidis.Client, execs ...rueidis.LuaExec) []rueidis.RedisResult {
	if len(execs) == 0 {
		return nil
	}
	cmds := make(rueidis.Commands, len(execs))
	for j, e := range execs {
		cmds[j] = c.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build()
	}
	rs := c.DoMulti(ctx, cmds...)
	var again []int
	for j, r := range rs {
		if err, ok := rueidis.IsRedisErr(r.Error()); ok && err.IsNoScript() {
			again = append(again, j)
		}
	}
	if len(again) > 0 {
		cmds = cmds[:0]
		for _, j := range again {
			e := execs[j]
			cmds = append(cmds, c.B().Eval().Script(s.src).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build())
		}
		for k, r := range c.DoMulti(ctx, cmds...) {
			rs[again[k]] = r
		}
	}
	return rs
}

// upsertScript pushes deadlines forward and reports which members are new.
// A writer that placed its timers under a topology older than the shard's
// floor is refused and writes nothing: it may hold devices that moved away
// from this shard, and the drain has already checked the shard clean.
//
// UpsertAt runs it only with the ids of a shard that its native ZADD XX GT
// CH did not change and ZMSCORE found absent or scored lower. Inside, ZADD XX GT CH again pushes every present
// member forward and counts what it changed (ARGV
// already holds the score, member pairs ZADD takes). XX adds nothing, so
// when every pair changed a member, every id was present and none is new.
// Otherwise (an id was absent, or already held this deadline or a later
// one) one ZMSCORE per chunk learns which ids are absent, before any is
// added, and one variadic ZADD GT adds them. Chunks bound what unpack puts
// on Lua's stack. An id given twice is reported once, at its later deadline.
//
// KEYS[1]: timer ZSET of one shard
// KEYS[2]: layout HASH of the shard
// ARGV[1]: epoch of the writer's topology (0: not checked)
// ARGV[2..]: deadline1, id1, deadline2, id2, ...
// Returns: the ids that were absent (first seen, or back after being lost),
// or the error STALE when the writer's epoch is below the floor.
var upsertScript = newScript(`
local epoch = tonumber(ARGV[1])
if epoch > 0 then
  local floor = redis.call('HGET', KEYS[2], 'floor')
  if floor and tonumber(floor) > epoch then
    return redis.error_reply('STALE topology epoch ' .. ARGV[1] .. ' below floor ' .. floor)
  end
end
local chunk = 2000
local changed = 0
for lo = 2, #ARGV, chunk do
  changed = changed + redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', unpack(ARGV, lo, math.min(lo + chunk - 1, #ARGV)))
end
if changed == (#ARGV - 1) / 2 then return {} end
local add, added, seen = {}, {}, {}
for lo = 2, #ARGV, chunk do
  local ids = {}
  for i = lo + 1, math.min(lo + chunk - 1, #ARGV), 2 do ids[#ids+1] = ARGV[i] end
  local scores = redis.call('ZMSCORE', KEYS[1], unpack(ids))
  for j = 1, #ids do
    if not scores[j] then
      add[#add+1] = ARGV[lo + 2*j - 2]
      add[#add+1] = ids[j]
      if not seen[ids[j]] then
        seen[ids[j]] = true
        added[#added+1] = ids[j]
      end
    end
  end
end
for lo = 1, #add, chunk do
  redis.call('ZADD', KEYS[1], 'GT', unpack(add, lo, math.min(lo + chunk - 1, #add)))
end
return added`)

// claimScript reads the due members of a shard, fenced by its lease, and
// the largest shard count writers may place the shard's timers under, so
// that a scanner learns of a doubling no later than the first write under it.
//
// KEYS[1]: timer ZSET of the shard
// KEYS[2]: lease key of the shard
// KEYS[3]: layout HASH of the shard
// ARGV[1]: lease value the caller holds
// ARGV[2]: horizon, unix ms: members scored at or below it are due
// ARGV[3]: batch limit
// Returns: {due (id, score, ...), head (id, score) or empty, layout shards
// or 0}, or the error NOTOWNER when the caller no longer holds the lease.
var claimScript = rueidis.NewLuaScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return redis.error_reply('NOTOWNER lease lost')
end
local due = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[2], 'BYSCORE', 'LIMIT', 0, ARGV[3], 'WITHSCORES')
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local shards = tonumber(redis.call('HGET', KEYS[3], 'shards') or '0')
return {due, head, shards}`)

// settleScript finishes a claimed batch: compare-and-remove for fired
// members, compare-and-move for deferred ones, fenced by the lease.
//
// KEYS[1]: timer ZSET of the shard
// KEYS[2]: lease key of the shard
// ARGV[1]: lease value the caller holds
// ARGV[2]: number of fired members n
// ARGV[3 .. 2+2n]: fired id, claimed score pairs (removed if unchanged)
// ARGV[3+2n ..]:   deferred id, claimed score, new score triples (moved if unchanged)
// Returns: {removed count, moved count, revived (id, score, ...)} where revived
// are fired members whose score changed after the claim (a reset landed).
var settleScript = rueidis.NewLuaScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return redis.error_reply('NOTOWNER lease lost')
end
local n = tonumber(ARGV[2])
local removed, moved, revived = 0, 0, {}
for i = 3, 2 + 2*n, 2 do
  local cur = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if cur then
    if tonumber(cur) == tonumber(ARGV[i+1]) then
      redis.call('ZREM', KEYS[1], ARGV[i])
      removed = removed + 1
    else
      revived[#revived+1] = ARGV[i]
      revived[#revived+1] = cur
    end
  end
end
for i = 3 + 2*n, #ARGV, 3 do
  local cur = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if cur and tonumber(cur) == tonumber(ARGV[i+1]) then
    redis.call('ZADD', KEYS[1], 'GT', ARGV[i+2], ARGV[i])
    moved = moved + 1
  end
end
return {removed, moved, revived}`)

// acquireScript takes a free lease and hands out a new fencing token.
//
// KEYS[1]: lease key of the shard
// KEYS[2]: fencing counter of the shard
// ARGV[1]: owner id (unique per process)
// ARGV[2]: ttl, ms
// Returns: the lease value "owner|token", or nil when another owner holds it.
var acquireScript = rueidis.NewLuaScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local v = ARGV[1] .. '|' .. redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
return v`)

// renewScript extends a lease the caller still holds.
//
// KEYS[1]: lease key; ARGV[1]: lease value; ARGV[2]: ttl, ms
// Returns: 1 if renewed, 0 if the lease is gone or someone else's.
var renewScript = rueidis.NewLuaScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`)

// releaseScript drops a lease the caller still holds.
//
// KEYS[1]: lease key; ARGV[1]: lease value
// Returns: 1 if released, 0 otherwise.
var releaseScript = rueidis.NewLuaScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// watermarkScript moves the ingest watermark forward and records a gap
// larger than the outage threshold as an outage.
//
// KEYS[1]: watermark key; KEYS[2]: outage list
// ARGV[1]: new watermark, unix ms; ARGV[2]: outage threshold, ms;
// ARGV[3]: outages kept
// Returns: the watermark after the call.
var watermarkScript = rueidis.NewLuaScript(`
local cur = redis.call('GET', KEYS[1])
local new = tonumber(ARGV[1])
if cur and new <= tonumber(cur) then return cur end
if cur and new - tonumber(cur) > tonumber(ARGV[2]) then
  redis.call('RPUSH', KEYS[2], cur .. ':' .. ARGV[1])
  redis.call('LTRIM', KEYS[2], -tonumber(ARGV[3]), -1)
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]`)

// seenScript records a device that is first seen or back after being lost,
// clearing its lost mark. A device without a type costs no registry entry
// at all: at millions of devices the registry would otherwise double
// Redis's memory per device. An entry is written only when its type is new
// or changed.
//
// KEYS[1]: registry partition of the device; KEYS[2]: its lost marks
// ARGV[1]: device id; ARGV[2]: type ("" if unknown); ARGV[3]: now, unix ms
// Returns: {previous registry value or nil, previous lost mark or nil}.
var seenScript = newScript(`
local old = redis.call('HGET', KEYS[1], ARGV[1])
local lost = redis.call('HGET', KEYS[2], ARGV[1])
if lost then redis.call('HDEL', KEYS[2], ARGV[1]) end
if ARGV[2] ~= '' then
  local d = {}
  if old then d = cjson.decode(old) end
  if d.t ~= ARGV[2] or d.f == nil then
    d.t = ARGV[2]
    if d.f == nil then d.f = tonumber(ARGV[3]) end
    redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(d))
  end
end
return {old or false, lost or false}`)

// clearLostScript clears the lost mark of a device if it is still the one
// set for the given deadline.
//
// KEYS[1]: lost marks of the device's partition; KEYS[2]: its registry
// partition; ARGV[1]: device id; ARGV[2]: deadline, unix ms
// Returns: {registry value or nil, the mark cleared} if a mark was
// cleared, else nil.
var clearLostScript = rueidis.NewLuaScript(`
local lost = redis.call('HGET', KEYS[1], ARGV[1])
if not lost then return false end
if tonumber(string.match(lost, '^%-?%d+')) ~= tonumber(ARGV[2]) then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
return {redis.call('HGET', KEYS[2], ARGV[1]) or false, lost}`)

// raiseScript raises a numeric HASH field, never lowering it.
//
// KEYS[1]: the HASH; ARGV[1]: field; ARGV[2]: value
// Returns: the field's value after the call.
var raiseScript = rueidis.NewLuaScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local v = tonumber(ARGV[2])
if v > cur then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return v
end
return cur`)

// doubleScript publishes a doubling: shards = 2N, prev = N, epoch + 1. The
// caller has already raised the layout of every old shard to 2N.
//
// KEYS[1]: topology HASH
// ARGV[1]: the epoch the caller read; ARGV[2]: now, unix ms;
// ARGV[3]: the largest shard count allowed
// Returns: the new epoch, or the error CHANGED (the topology moved since
// the caller read it), DRAINING (prev is not 0) or TOOMANY.
var doubleScript = rueidis.NewLuaScript(`
local t = redis.call('HMGET', KEYS[1], 'shards', 'prev', 'epoch')
local n, prev, epoch = tonumber(t[1]), tonumber(t[2] or '0'), tonumber(t[3])
if n == nil or epoch ~= tonumber(ARGV[1]) then
  return redis.error_reply('CHANGED topology changed meanwhile')
end
if prev ~= 0 then return redis.error_reply('DRAINING') end
if 2 * n > tonumber(ARGV[3]) then return redis.error_reply('TOOMANY') end
redis.call('HSET', KEYS[1], 'shards', 2 * n, 'prev', n, 'epoch', epoch + 1, 'since', ARGV[2])
return epoch + 1`)

// finishScript ends a doubling once every old shard reported itself drained
// for the current epoch: checked with its floor raised, and no moved member
// left in any family. The epoch moves on so that every role notices.
//
// KEYS[1]: topology HASH
// KEYS[2]: drain HASH (shard -> "epoch:moved:floored:ms")
// ARGV[1]: the epoch the caller read; ARGV[2]: now, unix ms
// Returns: 1 if the doubling ended, 0 if an old shard is not drained yet or
// the topology moved on.
var finishScript = rueidis.NewLuaScript(`
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
