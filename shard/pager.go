package shard

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// Listings page through sets that already are indexes in Redis — the
// deadline ZSETs (watched devices), the lost marks, a role's index kept in
// a HASH per registry partition (the alarm's open alarms) — with SCAN
// cursors, never a full scan per page.
//
// A listing visits its sources (shards or partitions) in ascending order,
// each with ZSCAN/HSCAN, several small ones in one round trip. A page ends
// between two SCAN replies, at (source, SCAN cursor): the reply that did
// not fit is read again, whole, by the next page. SCAN returns every member
// present for the whole iteration at least once, so a member present from
// the first page to the last is listed; one added or removed meanwhile may
// or may not be. A member is listed twice only when its HASH or ZSET is
// resized between two pages (duplicates are removed within a page, not
// across pages). Only a single reply larger than the whole page is cut,
// at an id (its members are taken in id order): exact for a small HASH or
// ZSET, which SCAN returns whole every time; for a big one it takes a
// limit below the few members a hash bucket holds, and then members
// removed between the two pages may make the second skip a member.
//
// Watched devices are listed shard by shard. A doubling moves a device
// from shard i only to i+N, a higher index, so a listing that reads the
// shard count at every page, and again before it ends, meets a moved
// device after its old shard: a move shows as a duplicate, never a gap.
// While a doubling drains, a member left in its old shard is listed there
// only if its new shard does not hold it.
//
// A page does bounded work: at most listRounds scan round trips (each
// followed by one round trip of lookups for its rows, for devices) and
// listExamine members read. It may hold fewer rows than its limit (a
// filter that matches few, sources mostly empty); "next" goes on from
// there, and only its absence says the listing is done.

// MaxListLimit is the largest page a listing returns.
const MaxListLimit = 1000

// ErrBadCursor is returned for a cursor that is not one a listing returned.
var ErrBadCursor = errors.New("bad cursor: pass the \"next\" of the previous page unchanged")

// The kinds of listing a cursor belongs to: these two, or the leaf name of
// the partition HASH a ListParts pages through.
const (
	ListWatched = "watched"
	ListLost    = "lost"
)

// cursorVersion changes whenever the meaning of a cursor does.
const cursorVersion = 1

// listCursor is the position of a listing; API clients see it as an
// opaque string.
type listCursor struct {
	V    int    `json:"v"`
	Kind string `json:"k"`
	// Shards is the shard count of the first page (watched devices): the
	// listing never ends below it.
	Shards int    `json:"n,omitempty"`
	Src    int    `json:"s,omitempty"` // shard or partition
	Scan   uint64 `json:"c,omitempty"` // SCAN cursor in Src
	After  string `json:"a,omitempty"` // the reply at Scan is listed up to this id (a cut reply)
}

func (c listCursor) encode() string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeCursor reads s ("" is the first page) for a listing of one of
// kinds.
func decodeCursor(s string, kinds ...string) (listCursor, error) {
	if s == "" {
		return listCursor{V: cursorVersion, Kind: kinds[0]}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return listCursor{}, ErrBadCursor
	}
	var c listCursor
	if json.Unmarshal(b, &c) != nil || c.V != cursorVersion || !slices.Contains(kinds, c.Kind) ||
		c.Src < 0 || c.Shards < 0 || c.Shards > MaxShards {
		return listCursor{}, ErrBadCursor
	}
	return c, nil
}

// listTrips counts the round trips of listings, for the tests that measure
// the cost of a page.
var listTrips atomic.Int64

// elem is one member a scan read: its id and value (score or HASH value),
// and the source it came from.
type elem struct {
	id, val string
	src     int
}

// scanSource names the sources of one listing.
type scanSource struct {
	key  func(src int) string
	zset bool
}

// minCount is the least SCAN COUNT of a source read beside others.
const minCount = 64

// group is the elements of one SCAN reply, in id order, and the position
// that reads it again.
type group struct {
	at listCursor
	es []elem
}

// scanRound reads, in one round trip, the next SCAN reply of pos.Src and
// of up to width-1 sources after it (below n), count the COUNT hint. It
// returns the replies in listing order and the position after them; done
// is set when no source is left. Replies after one whose source is not
// finished are dropped (the position cannot skip past it), so such a
// source sets width to 1; a round whose sources all finished widens it
// fourfold, up to maxWidth: small sources (the lost marks of a healthy
// fleet) go many to a round trip, big ones one at a time.
func (s *Store) scanRound(ctx context.Context, src scanSource, pos listCursor, n int, count int64, width *int, maxWidth int) ([]group, listCursor, bool, error) {
	if pos.Src >= n {
		return nil, pos, true, nil
	}
	var srcs []int
	var cmds rueidis.Commands
	for i := pos.Src; i < n && len(srcs) < *width; i++ {
		cur := uint64(0)
		if i == pos.Src {
			cur = pos.Scan
		}
		// The sources after the first share the COUNT: a big one among
		// them ends the round, so what the ones after it read is wasted.
		// It stays at least minCount, for a small HASH or ZSET kept as a
		// hash table (values over 64 bytes) to be read whole: SCAN stops
		// as soon as it holds COUNT members.
		c := count
		if i > pos.Src {
			c = max(minCount, count/int64(*width))
		}
		srcs = append(srcs, i)
		if src.zset {
			cmds = append(cmds, s.c.B().Zscan().Key(src.key(i)).Cursor(cur).Count(c).Build().Pin())
		} else {
			cmds = append(cmds, s.c.B().Hscan().Key(src.key(i)).Cursor(cur).Count(c).Build().Pin())
		}
	}
	var out []group
	next := pos
	listTrips.Add(1)
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		e, err := r.AsScanEntry()
		if err != nil {
			return nil, pos, false, fmt.Errorf("shard: list: scan %s: %w", src.key(srcs[j]), err)
		}
		at := listCursor{V: pos.V, Kind: pos.Kind, Shards: pos.Shards, Src: srcs[j]}
		if j == 0 {
			at = pos
		}
		g := group{at: at}
		for k := 0; k+1 < len(e.Elements); k += 2 {
			id := e.Elements[k]
			if at.After != "" && id <= at.After {
				continue
			}
			g.es = append(g.es, elem{id: id, val: e.Elements[k+1], src: srcs[j]})
		}
		slices.SortFunc(g.es, func(a, b elem) int { return strings.Compare(a.id, b.id) })
		out = append(out, g)
		if e.Cursor != 0 {
			next = listCursor{V: pos.V, Kind: pos.Kind, Shards: pos.Shards, Src: srcs[j], Scan: e.Cursor}
			if len(e.Elements)/2 >= minCount {
				*width = 1
			}
			return out, next, false, nil
		}
		next = listCursor{V: pos.V, Kind: pos.Kind, Shards: pos.Shards, Src: srcs[j] + 1}
	}
	*width = min(4**width, maxWidth)
	return out, next, next.Src >= n, nil
}

// The work of one page (see the top of this file).
const (
	listRounds  = 8
	listExamine = 20000
)

// page runs the scan rounds of one request from cur: each round's elements
// go through keep (which may make one more round trip for them) until the
// page is (nearly) full or the budget is spent. It returns the kept rows
// and the cursor of the next page ("" when the listing is done). n reads
// the number of sources, again (last) before the listing ends.
//
// A page ends between SCAN replies: a reply that does not fit is left
// whole to the next page, which scans its cursor again. Only a reply larger
// than the page itself is cut, at an id (see the top of this file): a
// small HASH or ZSET, which SCAN returns whole every time, or a limit
// below the few members one hash bucket holds.
func page[R any](ctx context.Context, s *Store, src scanSource, cur listCursor, limit, maxWidth int,
	n func(ctx context.Context, last bool) (int, error), keep func(ctx context.Context, es []elem) ([]R, []bool, error)) ([]R, string, error) {
	var rows []R
	seen := map[string]bool{}
	examined, width := 0, max(1, maxWidth/8)
	for round := 0; round < listRounds && examined < listExamine; round++ {
		room := limit - len(rows)
		// Nearly full: another round would read a reply that hardly fits.
		if room == 0 || round > 0 && room < limit/8 {
			return rows, cur.encode(), nil
		}
		count, err := n(ctx, false)
		if err != nil {
			return nil, "", err
		}
		// A reply holds COUNT members and the rest of the last hash
		// bucket read: aim a little below the room left.
		hint := int64(max(1, room-room/16-1))
		gs, next, done, err := s.scanRound(ctx, src, cur, count, hint, &width, maxWidth)
		if err != nil {
			return nil, "", err
		}
		// The replies go through keep a chunk at a time, each chunk about
		// what the page has room for: the replies past a full page are
		// not looked up.
		for lo := 0; lo < len(gs); {
			hi, size := lo, 0
			for hi < len(gs) && (hi == lo || size+len(gs[hi].es) <= limit-len(rows)) {
				size += len(gs[hi].es)
				hi++
			}
			var es []elem
			for _, g := range gs[lo:hi] {
				es = append(es, g.es...)
			}
			examined += len(es)
			kept, ok, err := keep(ctx, es)
			if err != nil {
				return nil, "", err
			}
			k := 0
			for _, g := range gs[lo:hi] {
				var take []int
				for j := k; j < k+len(g.es); j++ {
					if ok[j] && !seen[es[j].id] {
						take = append(take, j)
					}
				}
				k += len(g.es)
				if len(rows)+len(take) > limit {
					if len(rows) > 0 {
						return rows, g.at.encode(), nil
					}
					take = take[:limit]
					for _, j := range take {
						rows = append(rows, kept[j])
					}
					at := g.at
					at.After = es[take[limit-1]].id
					return rows, at.encode(), nil
				}
				for _, j := range take {
					seen[es[j].id] = true
					rows = append(rows, kept[j])
				}
			}
			if lo = hi; lo < len(gs) && (limit-len(rows) < max(1, limit/8) || examined >= listExamine) {
				// (Nearly) full, or out of budget: the next page starts at
				// the first reply not looked at.
				return rows, gs[lo].at.encode(), nil
			}
		}
		cur = next
		if done {
			// A doubling published meanwhile adds sources to visit.
			if more, err := n(ctx, true); err != nil {
				return nil, "", err
			} else if more <= cur.Src {
				return rows, "", nil
			}
		}
	}
	return rows, cur.encode(), nil
}

// PartQuery selects a page of the partition HASHes named Leaf: Keep judges
// each entry (field, value), nil keeps all; Limit is at most MaxListLimit
// (0: 100), Cursor the "next" of the previous page.
type PartQuery struct {
	Leaf, Cursor string
	Limit        int
	Keep         func(field, value string) bool
}

// PartEntry is one entry of a partition HASH.
type PartEntry struct{ Field, Value string }

// ListParts returns one page of the partition HASHes named q.Leaf,
// partition by partition, and the cursor of the next ("" on the last
// page).
func (s *Store) ListParts(ctx context.Context, q PartQuery) ([]PartEntry, string, error) {
	known("r", q.Leaf)
	if q.Limit == 0 {
		q.Limit = 100
	}
	if q.Limit < 0 || q.Limit > MaxListLimit {
		return nil, "", Refuse(ErrBadQuery, "limit %d: give 1 to %d", q.Limit, MaxListLimit)
	}
	cur, err := decodeCursor(q.Cursor, q.Leaf)
	if err != nil {
		return nil, "", err
	}
	n := func(context.Context, bool) (int, error) { return registryParts, nil }
	src := scanSource{key: func(p int) string { return s.k.partKeyAt(p, q.Leaf) }}
	keep := func(_ context.Context, es []elem) ([]PartEntry, []bool, error) {
		rows := make([]PartEntry, len(es))
		ok := make([]bool, len(es))
		for j, e := range es {
			rows[j], ok[j] = PartEntry{Field: e.id, Value: e.val}, q.Keep == nil || q.Keep(e.id, e.val)
		}
		return rows, ok, nil
	}
	return page(ctx, s, src, cur, q.Limit, 512, n, keep)
}
