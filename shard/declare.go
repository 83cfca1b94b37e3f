package shard

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
	"golang.org/x/sync/errgroup"
)

// The reasons a device is declared lost (the lost event's reason).
const (
	ReasonSilence    = "silence"    // its deadline passed
	ReasonWill       = "will"       // its status topic said offline (an MQTT will)
	ReasonDeath      = "death"      // a Sparkplug NDEATH or DDEATH
	ReasonDisconnect = "disconnect" // the broker reported its connection closed
	ReasonDeclared   = "declared"   // the deadline it declared itself (ttd, next) passed, or ttd 0
)

// ReasonExpired is the record of a deadline a device declared (ttd > 0,
// next): its lost event says declared, but it is a silence all the same,
// which an ingest outage may explain.
const ReasonExpired = "expired"

// A Declaration is a record of why a device's deadline is where it is,
// when something other than its threshold put it there: a presence event
// that lowered it (a will, a death) or a deadline the device declared.
// The scanner that fires the device at exactly At reads it to say why, and
// when the device was last heard of; at any other deadline it is stale
// and ignored, so it needs no cleaning up to stay true. A device keeps its
// latest few records, one per deadline (see Record): a record whose
// deadline lost to another's (a later ttd that GT refused, a will whose
// lowering did not apply) does not hide the record of the deadline that
// stands.
type Declaration struct {
	ID       string
	Reason   string
	At       int64 // the deadline it stands for, unix ms
	LastSeen int64 // the last time the device was heard of, unix ms
	Confirm  int64 // the hold-down before At, ms (confirm_after)
}

func (d Declaration) value() string {
	return d.Reason + ":" + strconv.FormatInt(d.At, 10) + ":" + strconv.FormatInt(d.LastSeen, 10) + ":" + strconv.FormatInt(d.Confirm, 10)
}

// declarationFor returns, of a device's stored records v, the one for
// deadline at.
func declarationFor(id, v string, at int64) Declaration {
	for e := range strings.SplitSeq(v, ";") {
		if d, ok := parseDeclaration(id, e); ok && d.At == at {
			return d
		}
	}
	return Declaration{}
}

func parseDeclaration(id, v string) (Declaration, bool) {
	p := strings.Split(v, ":")
	if len(p) != 4 {
		return Declaration{}, false
	}
	d := Declaration{ID: id, Reason: p[0]}
	var e1, e2, e3 error
	d.At, e1 = strconv.ParseInt(p[1], 10, 64)
	d.LastSeen, e2 = strconv.ParseInt(p[2], 10, 64)
	d.Confirm, e3 = strconv.ParseInt(p[3], 10, 64)
	if e1 != nil || e2 != nil || e3 != nil {
		return Declaration{}, false
	}
	return d, true
}

// keptDeclarations is how many records a device keeps, newest first: a
// few, since only one of the deadlines they stand for can be in force.
const keptDeclarations = 4

// recordScript puts a record first in a device's list, dropping one for
// the same deadline and the oldest beyond keptDeclarations.
//
// KEYS[1]: the records HASH of the device's registry partition
// ARGV[1]: device id; ARGV[2]: the record; ARGV[3]: its deadline;
// ARGV[4]: how many to keep
var recordScript = NewScript(`
local out = {ARGV[2]}
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  for e in string.gmatch(cur, '[^;]+') do
    if #out >= tonumber(ARGV[4]) then break end
    if string.match(e, '^[^:]*:([^:]*):') ~= ARGV[3] then out[#out + 1] = e end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], table.concat(out, ';'))
return 1
`)

// Record writes declarations, one round trip, before the deadlines they
// stand for are written: a scanner never fires a declared deadline
// without its record.
func (s *Store) Record(ctx context.Context, ds []Declaration) error {
	if len(ds) == 0 {
		return nil
	}
	keep := strconv.Itoa(keptDeclarations)
	calls := make([]Call, len(ds))
	for j, d := range ds {
		calls[j] = Call{Keys: []string{s.k.InPart(d.ID, "decl")}, Args: []string{d.ID, d.value(), strconv.FormatInt(d.At, 10), keep}}
	}
	for _, r := range s.ExecMulti(ctx, recordScript, calls...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: record declared deadlines: %w", err)
		}
	}
	return nil
}

// forgetScript drops a device's records for deadlines at or before the
// one that fired: they are spent. A later one (a signal after the fire)
// stays.
//
// KEYS[1]: the records HASH; ARGV[1]: device id; ARGV[2]: the deadline fired
var forgetScript = NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return 0 end
local out = {}
for e in string.gmatch(cur, '[^;]+') do
  local at = tonumber(string.match(e, '^[^:]*:([^:]*):'))
  if at and at > tonumber(ARGV[2]) then out[#out + 1] = e end
end
if #out == 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], table.concat(out, ';'))
end
return 1
`)

// ForgetDeclarations drops the records ds, whose deadlines fired, with
// any older ones of their devices (best effort: a record left behind is
// stale, and ignored).
func (s *Store) ForgetDeclarations(ctx context.Context, ds []Declaration) {
	if len(ds) == 0 {
		return
	}
	calls := make([]Call, len(ds))
	for j, d := range ds {
		calls[j] = Call{Keys: []string{s.k.InPart(d.ID, "decl")}, Args: []string{d.ID, strconv.FormatInt(d.At, 10)}}
	}
	s.ExecMulti(ctx, forgetScript, calls...)
}

// A Lowering asks that a watched device's deadline come down: the device,
// or the broker for it, said it is gone (a will, a death, ttd 0) at Report.
// It comes down to Report plus its type's confirm_after, unless a signal
// newer than the report already pushed it further than that signal's
// own deadline could be (Report plus its threshold; for the device's Own
// word, plus the longest deadline it may declare): such a signal may land
// first, flushed by another batch or process, and stands.
type Lowering struct {
	ID     string
	Type   string // "": the registered type
	Report int64  // unix ms
	Reason string
	Own    bool
}

// lowerScript lowers a device's deadline in one shard, fenced by topology.
// An absent device (lost, or never seen) stays absent. A deadline already
// at or before At, or at or before the horizon (a scanner may be firing
// it), or above Unless is left alone.
//
// KEYS[1]: deadline ZSET of one shard
// KEYS[2]: layout HASH of the shard
// KEYS[3]: wake key of the shard: the lowered deadline may be its new head
// ARGV[1]: epoch of the caller's topology; ARGV[2]: its shard count
// ARGV[3]: device id; ARGV[4]: At; ARGV[5]: Unless; ARGV[6]: horizon
// Returns: the deadline before the call if lowered, else nil; or STALE.
var lowerScript = NewScript(wakeLua + fenceLua + `
local cur = redis.call('ZSCORE', KEYS[1], ARGV[3])
if not cur then return false end
cur = tonumber(cur)
local at = tonumber(ARGV[4])
if cur <= at or cur <= tonumber(ARGV[6]) or cur > tonumber(ARGV[5]) then return false end
redis.call('ZADD', KEYS[1], 'XX', ARGV[4], ARGV[3])
wake(KEYS[3], at)
return string.format('%d', cur)`)

// lowerFanOut bounds the lowerings in flight at once.
const lowerFanOut = 16

// Lower applies ls: each device's record is written, then its deadline
// lowered in every shard that may hold it. lowered says, per lowering,
// whether a deadline came down. A failure leaves the others done; the
// caller retries the whole call (lowering is idempotent).
func (d *Devices) Lower(ctx context.Context, ls []Lowering) (lowered []bool, err error) {
	ids := make([]string, len(ls))
	for j, l := range ls {
		ids[j] = l.ID
	}
	types, err := d.store.Types(ctx, ids)
	if err != nil {
		return nil, err
	}
	// The record goes first, without the last signal's time, which only
	// the lowering reads; it is completed once the lowering is done.
	recs := make([]Declaration, len(ls))
	thr := make([]int64, len(ls))
	unless := make([]int64, len(ls))
	for j, l := range ls {
		typ := l.Type
		if typ == "" {
			typ = types[j]
		}
		t := d.thr.For(l.ID, typ)
		confirm := d.thr.ConfirmAfter(typ).Milliseconds()
		thr[j], unless[j] = t.Milliseconds(), l.Report+t.Milliseconds()
		if l.Own {
			unless[j] = l.Report + max(t, d.thr.Declared()).Milliseconds()
		}
		recs[j] = Declaration{ID: l.ID, Reason: l.Reason, At: l.Report + confirm, Confirm: confirm}
	}
	if err := d.store.Record(ctx, recs); err != nil {
		return nil, err
	}
	horizon := strconv.FormatInt(d.now().UnixMilli(), 10)
	lowered = make([]bool, len(ls))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(lowerFanOut)
	for j, l := range ls {
		g.Go(func() error {
			return d.onShards(gctx, l.ID, func(t Topology, i int) error {
				args := append(fenceArgs(t, l.ID), strconv.FormatInt(recs[j].At, 10), strconv.FormatInt(unless[j], 10), horizon)
				prev, err := lowerScript.exec(gctx, d.store.c, []string{d.store.k.Timers(Deadlines, i), d.store.k.Layout(i), d.store.k.Wake(Deadlines, i)}, args).AsInt64()
				if rueidis.IsRedisNil(err) {
					return nil
				}
				if err != nil {
					return fmt.Errorf("shard: lower deadline in shard %d: %w", i, err)
				}
				lowered[j] = true
				// A deadline the device declared is further than its
				// threshold: it was last heard of no later than the report.
				recs[j].LastSeen = max(recs[j].LastSeen, min(prev-thr[j], l.Report))
				return nil
			})
		})
	}
	if err := g.Wait(); err != nil {
		return lowered, err
	}
	var done []Declaration
	for j, r := range recs {
		if lowered[j] {
			done = append(done, r)
		}
	}
	return lowered, d.store.Record(ctx, done)
}
