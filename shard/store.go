package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// ErrNotOwner is returned by fenced operations when the caller's lease on a
// shard has expired or moved to another owner. Nothing was changed.
var ErrNotOwner = errors.New("shard: lease not held")

// Store is sigwatch's view of Redis: one shared rueidis client and the key
// layout. It is safe for concurrent use; calls from many goroutines are
// auto-pipelined by rueidis.
type Store struct {
	c rueidis.Client
	k Keys
}

// NewStore wraps a rueidis client.
func NewStore(c rueidis.Client, keys Keys) *Store { return &Store{c: c, k: keys} }

// Client returns the underlying client.
func (s *Store) Client() rueidis.Client { return s.c }

// Keys returns the key layout.
func (s *Store) Keys() Keys { return s.k }

// Topology is the shard layout: N shards, the N before the last doubling
// while it drains (0 otherwise), an epoch that grows with each change, and
// when the last change happened (unix ms, 0 before the first doubling).
type Topology struct {
	Shards int   `json:"shards"`
	Prev   int   `json:"prev"`
	Epoch  int64 `json:"epoch"`
	Since  int64 `json:"since,omitempty"`
}

// Draining reports whether a doubling is still draining.
func (t Topology) Draining() bool { return t.Prev != 0 }

// InitTopology creates the topology with initial shards if none exists and
// returns the topology in force.
func (s *Store) InitTopology(ctx context.Context, initial int) (Topology, error) {
	if err := ValidCount(initial); err != nil {
		return Topology{}, fmt.Errorf("shard: init topology: %w", err)
	}
	b := s.c.B()
	key := s.k.Topology()
	for _, r := range s.c.DoMulti(ctx,
		b.Hsetnx().Key(key).Field("shards").Value(strconv.Itoa(initial)).Build(),
		b.Hsetnx().Key(key).Field("prev").Value("0").Build(),
		b.Hsetnx().Key(key).Field("epoch").Value("1").Build(),
	) {
		if err := r.Error(); err != nil {
			return Topology{}, fmt.Errorf("shard: init topology: %w", err)
		}
	}
	return s.Topology(ctx)
}

// Topology reads the topology in force.
func (s *Store) Topology(ctx context.Context) (Topology, error) {
	m, err := s.c.Do(ctx, s.c.B().Hgetall().Key(s.k.Topology()).Build()).AsStrMap()
	if err != nil {
		return Topology{}, fmt.Errorf("shard: read topology: %w", err)
	}
	if len(m) == 0 {
		return Topology{}, errors.New("shard: no topology in Redis yet: start `sigwatch run` once to create it")
	}
	var t Topology
	t.Shards, _ = strconv.Atoi(m["shards"])
	t.Prev, _ = strconv.Atoi(m["prev"])
	t.Epoch, _ = strconv.ParseInt(m["epoch"], 10, 64)
	t.Since, _ = strconv.ParseInt(m["since"], 10, 64)
	if err := ValidCount(t.Shards); err != nil {
		return Topology{}, fmt.Errorf("shard: topology in Redis is corrupt: %w", err)
	}
	return t, nil
}

// Upsert pushes the deadlines of entries forward (ZADD GT) and returns the
// ids that were absent: first seen, or back after being lost. The write is
// idempotent and may be retried.
//
// Upsert is not fenced against a doubling: the caller must have placed
// byShard under the topology in force. Writers that may lag behind the
// topology (ingest) use a Writer, which places, fences and re-places.
func (s *Store) Upsert(ctx context.Context, f Family, byShard map[int][]Entry) ([]string, error) {
	added, _, err := s.UpsertAt(ctx, f, 0, byShard)
	return added, err
}

// UpsertAt is Upsert by a writer that placed byShard under the topology of
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
// ids found absent or scored below their new deadline go to the fenced
// upsert script, which adds them. An id already at this deadline or later
// needs nothing: GT would leave it as it is.
func (s *Store) UpsertAt(ctx context.Context, f Family, epoch int64, byShard map[int][]Entry) (added []string, refused []int, err error) {
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
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		i := shards[j]
		n, rerr := r.AsInt64()
		switch {
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
		if rerr != nil || len(scores) != len(uniq[i]) {
			todo[i] = uniq[i]
			continue
		}
		for k, e := range uniq[i] {
			if sc, serr := scores[k].AsFloat64(); serr != nil || sc < float64(e.Deadline) {
				todo[i] = append(todo[i], e)
			}
		}
	}
	ep := strconv.FormatInt(epoch, 10)
	rest := make([]int, 0, len(todo))
	execs := make([]rueidis.LuaExec, 0, len(todo))
	for i, es := range todo {
		args := make([]string, 0, 1+2*len(es))
		args = append(args, ep)
		for _, e := range es {
			args = append(args, strconv.FormatInt(e.Deadline, 10), e.ID)
		}
		rest = append(rest, i)
		execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.Timers(f, i), s.k.Layout(i)}, Args: args})
	}
	for j, r := range upsertScript.ExecMulti(ctx, s.c, execs...) {
		ids, rerr := r.AsStrSlice()
		switch {
		case rerr == nil:
			added = append(added, ids...)
		case strings.HasPrefix(rerr.Error(), "STALE"):
			refused = append(refused, rest[j])
		case err == nil:
			err = fmt.Errorf("shard: upsert: %w", rerr)
		}
	}
	return added, refused, err
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

// Set writes one deadline unconditionally (ZADD without GT), for changes that
// may move a deadline earlier, such as a lowered threshold.
func (s *Store) Set(ctx context.Context, f Family, i int, e Entry) error {
	err := s.c.Do(ctx, s.c.B().Zadd().Key(s.k.Timers(f, i)).ScoreMember().
		ScoreMember(float64(e.Deadline), e.ID).Build()).Error()
	if err != nil {
		return fmt.Errorf("shard: set %s in shard %d: %w", f, i, err)
	}
	return nil
}

// Score returns the deadline of id in shard i, and false if it is absent.
func (s *Store) Score(ctx context.Context, f Family, i int, id string) (int64, bool, error) {
	v, err := s.c.Do(ctx, s.c.B().Zscore().Key(s.k.Timers(f, i)).Member(id).Build()).AsFloat64()
	if rueidis.IsRedisNil(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("shard: score in shard %d: %w", i, err)
	}
	return int64(v), true, nil
}

// Scores returns the deadline of each ids[j] in shard shards[j], in one
// round trip; ok[j] is false where it is absent.
func (s *Store) Scores(ctx context.Context, f Family, shards []int, ids []string) (scores []int64, ok []bool, err error) {
	if len(ids) == 0 {
		return nil, nil, nil
	}
	cmds := make(rueidis.Commands, len(ids))
	for j, id := range ids {
		cmds[j] = s.c.B().Zscore().Key(s.k.Timers(f, shards[j])).Member(id).Build()
	}
	scores, ok = make([]int64, len(ids)), make([]bool, len(ids))
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		v, err := r.AsFloat64()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("shard: scores: %w", err)
		}
		scores[j], ok[j] = int64(v), true
	}
	return scores, ok, nil
}

// Remove deletes id from shard i unconditionally (the device is no longer
// watched).
func (s *Store) Remove(ctx context.Context, f Family, i int, id string) (bool, error) {
	n, err := s.c.Do(ctx, s.c.B().Zrem().Key(s.k.Timers(f, i)).Member(id).Build()).AsInt64()
	if err != nil {
		return false, fmt.Errorf("shard: remove from shard %d: %w", i, err)
	}
	return n == 1, nil
}

// Size returns the number of members of shard i.
func (s *Store) Size(ctx context.Context, f Family, i int) (int64, error) {
	n, err := s.c.Do(ctx, s.c.B().Zcard().Key(s.k.Timers(f, i)).Build()).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("shard: size of shard %d: %w", i, err)
	}
	return n, nil
}

// Head returns the earliest entry of shard i, and false if the shard is empty.
func (s *Store) Head(ctx context.Context, f Family, i int) (Entry, bool, error) {
	v, err := s.c.Do(ctx, s.c.B().Zrange().Key(s.k.Timers(f, i)).Min("0").Max("0").Withscores().Build()).ToArray()
	if err != nil {
		return Entry{}, false, fmt.Errorf("shard: head of shard %d: %w", i, err)
	}
	es, err := parseEntries(v)
	if err != nil || len(es) == 0 {
		return Entry{}, false, err
	}
	return es[0], true, nil
}

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

// Claim reads up to limit members of shard i due at or before horizon, the
// shard's head and its layout. It fails with ErrNotOwner unless lease is
// still the shard's lease.
func (s *Store) Claim(ctx context.Context, f Family, i int, lease Lease, horizon int64, limit int) (Claimed, error) {
	v, err := claimScript.Exec(ctx, s.c, []string{s.k.Timers(f, i), s.k.Owner(i), s.k.Layout(i)},
		[]string{lease.Value, strconv.FormatInt(horizon, 10), strconv.Itoa(limit)}).ToArray()
	if err != nil {
		return Claimed{}, fenceErr("claim", i, err)
	}
	if len(v) != 3 {
		return Claimed{}, fmt.Errorf("shard: claim shard %d: unexpected reply", i)
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
	v, err := settleScript.Exec(ctx, s.c, []string{s.k.Timers(f, i), s.k.Owner(i)}, args).ToArray()
	if err != nil {
		return Settled{}, fenceErr("settle", i, err)
	}
	if len(v) != 3 {
		return Settled{}, fmt.Errorf("shard: settle shard %d: unexpected reply", i)
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

func fenceErr(op string, i int, err error) error {
	if strings.Contains(err.Error(), "NOTOWNER") {
		return fmt.Errorf("shard: %s shard %d: %w", op, i, ErrNotOwner)
	}
	return fmt.Errorf("shard: %s shard %d: %w", op, i, err)
}

// parseEntries reads a flat (member, score, ...) reply, as scripts return
// it, or RESP3's list of (member, score) pairs.
func parseEntries(v []rueidis.RedisMessage) ([]Entry, error) {
	if len(v) > 0 && v[0].IsArray() {
		flat := make([]rueidis.RedisMessage, 0, 2*len(v))
		for _, pair := range v {
			p, err := pair.ToArray()
			if err != nil || len(p) != 2 {
				return nil, errors.New("malformed member/score pair")
			}
			flat = append(flat, p...)
		}
		v = flat
	}
	if len(v)%2 != 0 {
		return nil, errors.New("odd member/score reply")
	}
	es := make([]Entry, 0, len(v)/2)
	for j := 0; j < len(v); j += 2 {
		id, err := v[j].ToString()
		if err != nil {
			return nil, err
		}
		sc, err := v[j+1].AsFloat64()
		if err != nil {
			return nil, err
		}
		es = append(es, Entry{ID: id, Deadline: int64(sc)})
	}
	return es, nil
}

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

// Acquire takes shard i's lease for owner if it is free. ok is false when
// another owner holds it.
func (s *Store) Acquire(ctx context.Context, i int, owner string, ttl time.Duration) (l Lease, ok bool, err error) {
	v, err := acquireScript.Exec(ctx, s.c, []string{s.k.Owner(i), s.k.Fence(i)},
		[]string{owner, strconv.FormatInt(ttl.Milliseconds(), 10)}).ToString()
	if rueidis.IsRedisNil(err) {
		return Lease{}, false, nil
	}
	if err != nil {
		return Lease{}, false, fmt.Errorf("shard: acquire lease of shard %d: %w", i, err)
	}
	return Lease{Shard: i, Value: v}, true, nil
}

// Renew extends l. It returns ErrNotOwner if l was lost.
func (s *Store) Renew(ctx context.Context, l Lease, ttl time.Duration) error {
	n, err := renewScript.Exec(ctx, s.c, []string{s.k.Owner(l.Shard)},
		[]string{l.Value, strconv.FormatInt(ttl.Milliseconds(), 10)}).AsInt64()
	if err != nil {
		return fmt.Errorf("shard: renew lease of shard %d: %w", l.Shard, err)
	}
	if n != 1 {
		return fmt.Errorf("shard: renew lease of shard %d: %w", l.Shard, ErrNotOwner)
	}
	return nil
}

// Release gives l up so another replica can take the shard at once.
func (s *Store) Release(ctx context.Context, l Lease) error {
	if err := releaseScript.Exec(ctx, s.c, []string{s.k.Owner(l.Shard)}, []string{l.Value}).Error(); err != nil {
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

// Outage is a gap in the ingest watermark: ingest was not known to be
// consuming between Start and End (unix ms).
type Outage struct{ Start, End int64 }

// outagesKept bounds the outage list.
const outagesKept = 256

// AdvanceWatermark moves the ingest watermark forward to ms. A jump larger
// than gap is recorded as an outage.
func (s *Store) AdvanceWatermark(ctx context.Context, ms int64, gap time.Duration) (int64, error) {
	v, err := watermarkScript.Exec(ctx, s.c, []string{s.k.Watermark(), s.k.Outages()},
		[]string{strconv.FormatInt(ms, 10), strconv.FormatInt(gap.Milliseconds(), 10), strconv.Itoa(outagesKept)}).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("shard: advance watermark: %w", err)
	}
	return v, nil
}

// Watermark returns the ingest watermark (0 if ingest never ran) and the
// recorded outages, oldest first.
func (s *Store) Watermark(ctx context.Context) (int64, []Outage, error) {
	b := s.c.B()
	rs := s.c.DoMulti(ctx,
		b.Get().Key(s.k.Watermark()).Build(),
		b.Lrange().Key(s.k.Outages()).Start(0).Stop(-1).Build())
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

func parseOutage(r string) (Outage, bool) {
	a, b, ok := strings.Cut(r, ":")
	if !ok {
		return Outage{}, false
	}
	start, err1 := strconv.ParseInt(a, 10, 64)
	end, err2 := strconv.ParseInt(b, 10, 64)
	return Outage{Start: start, End: end}, err1 == nil && err2 == nil
}

// WatermarkHead returns the ingest watermark, the number of recorded
// outages and the last of them: enough for a reader that keeps the outages
// to tell whether they changed (the list only grows at its end and is
// trimmed at its start) without reading them all again. An entry that does
// not parse counts as absent, as Watermark skips it.
func (s *Store) WatermarkHead(ctx context.Context) (wm, n int64, last Outage, err error) {
	b := s.c.B()
	rs := s.c.DoMulti(ctx,
		b.Get().Key(s.k.Watermark()).Build(),
		b.Llen().Key(s.k.Outages()).Build(),
		b.Lindex().Key(s.k.Outages()).Index(-1).Build())
	wm, err = rs[0].AsInt64()
	if err != nil && !rueidis.IsRedisNil(err) {
		return 0, 0, Outage{}, fmt.Errorf("shard: read watermark: %w", err)
	}
	if n, err = rs[1].AsInt64(); err != nil {
		return 0, 0, Outage{}, fmt.Errorf("shard: read outages: %w", err)
	}
	raw, err := rs[2].ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		return 0, 0, Outage{}, fmt.Errorf("shard: read outages: %w", err)
	}
	last, _ = parseOutage(raw)
	return wm, n, last, nil
}

// Device is what the registry knows about a device. It is written when a
// device is first seen, comes back, is lost or is changed — never per signal.
type Device struct {
	Type      string `json:"t,omitempty"`
	FirstSeen int64  `json:"f,omitempty"`
	// LostDeadline is the deadline the device was declared lost at, 0 while
	// it is not lost; LostAt is when that was declared. They are kept in
	// the partition's lost marks, not in the entry.
	LostDeadline int64 `json:"-"`
	LostAt       int64 `json:"-"`
}

func parseDevice(s string) (Device, error) {
	var d Device
	if err := json.Unmarshal([]byte(s), &d); err != nil {
		return Device{}, fmt.Errorf("registry entry %q: %w", s, err)
	}
	return d, nil
}

// lostMark is the value of a lost mark: "<deadline>:<at>", unix ms.
func lostMark(deadline, at int64) string {
	return strconv.FormatInt(deadline, 10) + ":" + strconv.FormatInt(at, 10)
}

func parseLostMark(s string) (deadline, at int64, err error) {
	dl, a, ok := strings.Cut(s, ":")
	if ok {
		if deadline, err = strconv.ParseInt(dl, 10, 64); err == nil {
			at, err = strconv.ParseInt(a, 10, 64)
		}
	}
	if !ok || err != nil {
		return 0, 0, fmt.Errorf("lost mark %q: not <deadline>:<at>", s)
	}
	return deadline, at, nil
}

// device builds a Device from a registry value and a lost mark, either
// possibly nil (absent).
func device(reg, lost rueidis.RedisMessage) (d Device, found bool, err error) {
	if v, e := reg.ToString(); e == nil {
		found = true
		if d, err = parseDevice(v); err != nil {
			return Device{}, true, err
		}
	}
	if v, e := lost.ToString(); e == nil {
		found = true
		if d.LostDeadline, d.LostAt, err = parseLostMark(v); err != nil {
			return d, true, err
		}
	}
	return d, found, nil
}

// Sighting is one device for SeenMulti: ID and Type go in; the previous
// entry (Prev, with any lost mark; Existed false when the device is new) and
// Err come out.
type Sighting struct {
	ID, Type string
	Prev     Device
	Existed  bool
	Err      error
}

// SeenMulti records that each device of ss was first seen or came back,
// with its type, and clears any lost mark, all in one round trip: a flush
// full of first-seen devices (a start, or a doubling's drain) costs one
// round trip, not one per device. It fills in ss and returns it.
func (s *Store) SeenMulti(ctx context.Context, ss []Sighting, now int64) []Sighting {
	nowArg := strconv.FormatInt(now, 10)
	execs := make([]rueidis.LuaExec, len(ss))
	for j, d := range ss {
		execs[j] = rueidis.LuaExec{Keys: []string{s.k.Registry(d.ID), s.k.Lost(d.ID)}, Args: []string{d.ID, d.Type, nowArg}}
	}
	for j, r := range seenScript.ExecMulti(ctx, s.c, execs...) {
		d := &ss[j]
		d.Prev, d.Existed, d.Err = Device{}, false, nil
		v, err := r.ToArray()
		if err == nil && len(v) != 2 {
			err = errors.New("unexpected reply")
		}
		if err == nil {
			d.Prev, d.Existed, err = device(v[0], v[1])
		}
		if err != nil {
			d.Prev, d.Existed, d.Err = Device{}, false, fmt.Errorf("shard: record device: %w", err)
		}
	}
	return ss
}

// MarkLost records that id was declared lost at deadline.
func (s *Store) MarkLost(ctx context.Context, id string, deadline, at int64) error {
	return s.MarkLostMulti(ctx, []Entry{{ID: id, Deadline: deadline}}, at)[0]
}

// MarkLostMulti records that each device of lost was declared lost at its
// deadline, all in one round trip, and returns one error per entry.
func (s *Store) MarkLostMulti(ctx context.Context, lost []Entry, at int64) []error {
	cmds := make(rueidis.Commands, len(lost))
	for j, e := range lost {
		cmds[j] = s.c.B().Hset().Key(s.k.Lost(e.ID)).FieldValue().FieldValue(e.ID, lostMark(e.Deadline, at)).Build()
	}
	errs := make([]error, len(lost))
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			errs[j] = fmt.Errorf("shard: mark device lost: %w", err)
		}
	}
	return errs
}

// ClearLost clears id's lost mark if it is the one set for deadline, and
// returns the device as it was; ok is false if there was no such mark.
func (s *Store) ClearLost(ctx context.Context, id string, deadline int64) (prev Device, ok bool, err error) {
	v, err := clearLostScript.Exec(ctx, s.c, []string{s.k.Lost(id), s.k.Registry(id)},
		[]string{id, strconv.FormatInt(deadline, 10)}).ToArray()
	if rueidis.IsRedisNil(err) {
		return Device{}, false, nil
	}
	if err == nil && len(v) != 2 {
		err = errors.New("unexpected reply")
	}
	if err == nil {
		prev, _, err = device(v[0], v[1])
	}
	if err != nil {
		return Device{}, false, fmt.Errorf("shard: clear lost mark: %w", err)
	}
	return prev, true, nil
}

// Devices reads the registry entries and lost marks of ids in one round
// trip; a missing entry is the zero Device.
func (s *Store) Devices(ctx context.Context, ids []string) ([]Device, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	b := s.c.B()
	cmds := make(rueidis.Commands, 0, 2*len(ids))
	for _, id := range ids {
		cmds = append(cmds, b.Hget().Key(s.k.Registry(id)).Field(id).Build(), b.Hget().Key(s.k.Lost(id)).Field(id).Build())
	}
	rs := s.c.DoMulti(ctx, cmds...)
	out := make([]Device, len(ids))
	for j := range ids {
		for _, r := range rs[2*j : 2*j+2] {
			if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
				return nil, fmt.Errorf("shard: read registry: %w", err)
			}
		}
		// A corrupt entry reads as unknown rather than stalling the batch
		// that holds it: the device still fires, with the default type.
		reg, _ := rs[2*j].ToMessage()
		lost, _ := rs[2*j+1].ToMessage()
		out[j], _, _ = device(reg, lost)
	}
	return out, nil
}

// Types reads the registered types of ids in one round trip ("" for a
// device of the default type or a corrupt entry): what firing needs, without
// the lost marks.
func (s *Store) Types(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make(rueidis.Commands, len(ids))
	for j, id := range ids {
		cmds[j] = s.c.B().Hget().Key(s.k.Registry(id)).Field(id).Build()
	}
	out := make([]string, len(ids))
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		v, err := r.ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("shard: read registry: %w", err)
		}
		d, _ := parseDevice(v)
		out[j] = d.Type
	}
	return out, nil
}

// Forget removes id from the registry, its lost mark and its threshold
// override.
func (s *Store) Forget(ctx context.Context, id string) error {
	b := s.c.B()
	for _, r := range s.c.DoMulti(ctx,
		b.Hdel().Key(s.k.Registry(id)).Field(id).Build(),
		b.Hdel().Key(s.k.Lost(id)).Field(id).Build(),
		b.Hdel().Key(s.k.Overrides()).Field(id).Build(),
		b.Incr().Key(s.k.OverridesVersion()).Build()) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: forget device: %w", err)
		}
	}
	return nil
}

// SetOverride sets a per-device threshold (0 removes it).
func (s *Store) SetOverride(ctx context.Context, id string, threshold time.Duration) error {
	b := s.c.B()
	var set rueidis.Completed
	if threshold <= 0 {
		set = b.Hdel().Key(s.k.Overrides()).Field(id).Build()
	} else {
		set = b.Hset().Key(s.k.Overrides()).FieldValue().FieldValue(id, strconv.FormatInt(threshold.Milliseconds(), 10)).Build()
	}
	for _, r := range s.c.DoMulti(ctx, set, b.Incr().Key(s.k.OverridesVersion()).Build()) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: set threshold override: %w", err)
		}
	}
	return nil
}

// OverridesVersion returns a number that changes whenever overrides do.
func (s *Store) OverridesVersion(ctx context.Context) (int64, error) {
	v, err := s.c.Do(ctx, s.c.B().Get().Key(s.k.OverridesVersion()).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("shard: read overrides version: %w", err)
	}
	return v, nil
}

// Overrides returns every per-device threshold.
func (s *Store) Overrides(ctx context.Context) (map[string]time.Duration, error) {
	m, err := s.c.Do(ctx, s.c.B().Hgetall().Key(s.k.Overrides()).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("shard: read overrides: %w", err)
	}
	out := make(map[string]time.Duration, len(m))
	for id, v := range m {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms > 0 {
			out[id] = time.Duration(ms) * time.Millisecond
		}
	}
	return out, nil
}

// Heartbeat registers a scanner replica as alive until now+ttl and returns
// the live replicas, sorted.
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
