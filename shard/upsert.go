package shard

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"
)

// Upsert pushes the deadlines of entries forward (ZADD GT) and returns the
// ids that were absent: first seen, or back after being lost. The write is
// idempotent and may be retried.
//
// Upsert is not fenced against a doubling: the caller must have placed
// byShard under the topology in force. Writers that may lag behind the
// topology (ingest) use a Writer, which places, fences and re-places.
func (s *Store) Upsert(ctx context.Context, f Family, byShard map[int][]Entry) ([]string, error) {
	added, _, err := s.upsertAt(ctx, f, 0, byShard, nil)
	return added, err
}

// Admit decides which entries found absent from their shard may be added
// (and those added at a lower deadline since the native write, which may be
// gone again by the time the script runs): a device that is absent is new,
// or was lost, and a late signal must not bring it back (docs/guarantees.md,
// guarantee 7). It returns the entries to write; the others are left out.
// An error fails the write, which the caller retries. A nil Admit admits
// all.
type Admit func(ctx context.Context, absent []Entry) ([]Entry, error)

// writerFence is the Lua that opens every script adding timers to a shard:
// it refuses a writer whose topology is older than the shard's floor
// (STALE), or whose generation is not the shard's (LOSTDATA).
//
// KEYS[2]: layout HASH of the shard
// ARGV[1]: epoch of the writer's topology (0: not checked)
// ARGV[2]: the writer's generation ("" to skip the check)
const writerFence = `
local epoch = tonumber(ARGV[1])
if epoch > 0 then
  local floor = redis.call('HGET', KEYS[2], 'floor')
  if floor and tonumber(floor) > epoch then
    return redis.error_reply('STALE topology epoch ' .. ARGV[1] .. ' below floor ' .. floor)
  end
end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[2], 'gen') ~= ARGV[2] then
  return redis.error_reply('LOSTDATA shard not vetted under generation ' .. ARGV[2])
end`

// upsertScript pushes deadlines forward and reports which members are new.
// A writer that placed its timers under a topology older than the shard's
// floor is refused and writes nothing: it may hold devices that moved away
// from this shard, and the drain has already checked the shard clean.
//
// upsertAt runs it only with the ids of a shard that its native ZADD XX GT
// CH did not change and ZMSCORE found absent or scored lower. Inside, ZADD
// XX GT CH again pushes every present member forward and counts what it
// changed (ARGV already holds the score, member pairs ZADD takes). XX adds
// nothing, so when every pair changed a member, every id was present and
// none is new. Otherwise (an id was absent, or already held this deadline
// or a later one) one ZMSCORE per chunk learns which ids are absent, before
// any is added, and one variadic ZADD GT adds them. Chunks bound what
// unpack puts on Lua's stack. An id given twice is reported once, at its
// later deadline.
//
// KEYS[1]: timer ZSET of one shard
// KEYS[2]: layout HASH of the shard
// KEYS[3]: wake key of the shard: an added id may be its new head
// ARGV[1]: epoch of the writer's topology (0: not checked)
// ARGV[2]: the writer's generation ("" to skip the check)
// ARGV[3..]: deadline1, id1, deadline2, id2, ...
// Returns: the ids that were absent (first seen, or back after being lost),
// the error STALE when the writer's epoch is below the floor, or LOSTDATA
// when the shard's generation is not the writer's: an id absent from data
// Redis lost is not new, and is not added until the data is restored.
var upsertScript = NewScript(wakeLua + writerFence + `
local chunk = 2000
local changed = 0
for lo = 3, #ARGV, chunk do
  changed = changed + redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', unpack(ARGV, lo, math.min(lo + chunk - 1, #ARGV)))
end
if changed == (#ARGV - 2) / 2 then return {} end
local add, added, seen = {}, {}, {}
for lo = 3, #ARGV, chunk do
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
local low
for lo = 1, #add, chunk do
  redis.call('ZADD', KEYS[1], 'GT', unpack(add, lo, math.min(lo + chunk - 1, #add)))
end
for j = 1, #add, 2 do
  local d = tonumber(add[j])
  if not low or d < low then low = d end
end
wake(KEYS[3], low)
return added`)

// upsertAt is Upsert by a writer that placed byShard under the topology of
// epoch (0: not checked). Shards whose floor is above epoch refuse the
// write and are returned in refused: their absent ids were not added, and
// their entries must be placed again under a newer topology.
//
// The steady state costs one native variadic ZADD XX GT CH per shard, all
// shards in one round trip: it pushes present members forward and counts
// what it changed. XX adds nothing, so it needs no fence: it cannot put a
// device back into a shard it moved away from, and a moved member still
// present in its old shard is one the crossing rule already handles (its
// effective deadline is the later of its two scores). A shard where
// something did not change (an id was absent, or already held this
// deadline or a later one) is read back with one native ZMSCORE; only the
// ids found absent or scored below their new deadline go to upsertScript,
// which adds them. An id already at this deadline or later needs nothing:
// GT would leave it as it is.
//
// With admit set, the ids that need the script go through admit first and
// only those it returns are written; the rest are left out, unwritten. So
// that no id is added unadmitted, a failed native call then fails the
// shard's write instead of leaving it all to the script.
func (s *Store) upsertAt(ctx context.Context, f Family, epoch int64, byShard map[int][]Entry, admit Admit) (added []string, refused []int, err error) {
	if len(byShard) == 0 {
		return nil, nil, nil
	}
	shards := make([]int, 0, len(byShard))
	cmds := make(rueidis.Commands, 0, len(byShard))
	uniq := make(map[int][]Entry, len(byShard))
	for i, es := range byShard {
		if len(es) == 0 {
			continue
		}
		// The count ZADD CH returns says every id was present only if no id
		// is given twice.
		es = latest(es)
		uniq[i] = es
		z := s.c.B().Zadd().Key(s.k.Timers(f, i)).Xx().Gt().Ch().ScoreMember()
		for _, e := range es {
			z = z.ScoreMember(float64(e.Deadline), e.ID)
		}
		shards = append(shards, i)
		cmds = append(cmds, z.Build())
	}
	// A shard whose count fell short had an id that was absent or already
	// held this deadline or a later one. One native ZMSCORE tells which:
	// only ids that are absent, or scored below ours (absent at the ZADD,
	// added lower since), need the script.
	var short []int
	var reads rueidis.Commands
	todo := make(map[int][]Entry)
	fail := func(rerr error) {
		if err == nil {
			err = fmt.Errorf("shard: upsert: %w", rerr)
		}
	}
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		i := shards[j]
		n, rerr := r.AsInt64()
		switch {
		case rerr != nil && admit != nil:
			fail(rerr)
		case rerr != nil:
			todo[i] = uniq[i] // the script does it all again, idempotently
		case n != int64(len(uniq[i])):
			ids := make([]string, len(uniq[i]))
			for k, e := range uniq[i] {
				ids[k] = e.ID
			}
			short = append(short, i)
			reads = append(reads, s.c.B().Zmscore().Key(s.k.Timers(f, i)).Member(ids...).Build())
		}
	}
	for j, r := range s.c.DoMulti(ctx, reads...) {
		i := short[j]
		scores, rerr := r.ToArray()
		if rerr == nil && len(scores) != len(uniq[i]) {
			rerr = fmt.Errorf("ZMSCORE returned %d scores for %d ids", len(scores), len(uniq[i]))
		}
		if rerr != nil {
			if admit != nil {
				fail(rerr)
			} else {
				todo[i] = uniq[i]
			}
			continue
		}
		for k, e := range uniq[i] {
			if sc, serr := scores[k].AsFloat64(); serr != nil || sc < float64(e.Deadline) {
				todo[i] = append(todo[i], e)
			}
		}
	}
	if admit != nil && len(todo) > 0 {
		if todo, err = s.admit(ctx, admit, todo, err); len(todo) == 0 {
			return nil, nil, err
		}
	}
	ep, gen := strconv.FormatInt(epoch, 10), s.Generation()
	rest := make([]int, 0, len(todo))
	execs := make([]rueidis.LuaExec, 0, len(todo))
	for i, es := range todo {
		args := make([]string, 0, 2+2*len(es))
		args = append(args, ep, gen)
		for _, e := range es {
			args = append(args, strconv.FormatInt(e.Deadline, 10), e.ID)
		}
		rest = append(rest, i)
		execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.Timers(f, i), s.k.Layout(i), s.k.Wake(f, i)}, Args: args})
	}
	for j, r := range upsertScript.execMulti(ctx, s.c, execs...) {
		ids, rerr := r.AsStrSlice()
		switch {
		case rerr == nil:
			added = append(added, ids...)
		case errors.Is(rerr, ErrStaleTopology):
			refused = append(refused, rest[j])
		default:
			s.lossSeen(rerr)
			fail(rerr)
		}
	}
	return added, refused, err
}

// admit passes the entries of todo through admit, all shards in one call,
// and returns what it admitted, by shard. A failed admit fails the write:
// nothing unadmitted is written. err is the write's error so far.
func (s *Store) admit(ctx context.Context, admit Admit, todo map[int][]Entry, err error) (map[int][]Entry, error) {
	var all []Entry
	for _, es := range todo {
		all = append(all, es...)
	}
	ok, aerr := admit(ctx, all)
	if aerr != nil {
		return nil, errors.Join(err, fmt.Errorf("shard: upsert: admit: %w", aerr))
	}
	in := make(map[string]bool, len(ok))
	for _, e := range ok {
		in[e.ID] = true
	}
	out := make(map[int][]Entry, len(todo))
	for i, es := range todo {
		for _, e := range es {
			if in[e.ID] {
				out[i] = append(out[i], e)
			}
		}
	}
	return out, err
}

// latest returns es with each id once, at its latest deadline. It returns
// es itself when no id repeats.
func latest(es []Entry) []Entry {
	if len(es) < 2 {
		return es
	}
	at := make(map[string]int, len(es))
	var out []Entry
	for j, e := range es {
		k, dup := at[e.ID]
		switch {
		case !dup && out == nil:
			at[e.ID] = j
		case !dup:
			at[e.ID] = len(out)
			out = append(out, e)
		default:
			if out == nil {
				out = append(make([]Entry, 0, len(es)), es[:j]...)
			}
			out[k].Deadline = max(out[k].Deadline, e.Deadline)
		}
	}
	if out == nil {
		return es
	}
	return out
}
