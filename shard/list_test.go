package shard_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// fleet writes n watched devices id-0..id-(n-1) with deadlines around
// base under n shards, a batch per round trip, and returns their ids.
func fleet(t *testing.T, s *shard.Store, prefix string, n, shards int, base int64) []string {
	t.Helper()
	ids := make([]string, n)
	for lo := 0; lo < n; lo += 10000 {
		byShard := map[int][]shard.Entry{}
		for k := lo; k < min(lo+10000, n); k++ {
			ids[k] = fmt.Sprintf("%s-%d", prefix, k)
			i := shard.Of(ids[k], shards)
			byShard[i] = append(byShard[i], shard.Entry{ID: ids[k], Deadline: base + int64(k%1000)})
		}
		if _, err := s.Upsert(t.Context(), shard.Deadlines, byShard); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// listAll pages through q with limit rows per page and returns how often
// each device was listed, the pages and the time they took.
func listAll(t *testing.T, d *shard.Devices, q shard.DeviceQuery, between func(page int)) (map[string]int, int, time.Duration) {
	t.Helper()
	seen := map[string]int{}
	pages := 0
	var took time.Duration
	for {
		start := time.Now()
		rows, next, err := d.List(t.Context(), q)
		took += time.Since(start)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		pages++
		if len(rows) > q.Limit {
			t.Fatalf("page %d holds %d rows, over its limit %d", pages, len(rows), q.Limit)
		}
		for _, r := range rows {
			seen[r.Device]++
		}
		if next == "" {
			return seen, pages, took
		}
		q.Cursor = next
		if between != nil {
			between(pages)
		}
	}
}

// TestPagingWatchedUnderSignals pages through 100k watched devices, 1000 a
// page, while signals keep pushing deadlines and new devices arrive: every
// device present throughout is listed exactly once (the ZSETs are sized so
// that no dict resize happens, the one source of duplicates ZSCAN allows).
// Then it pages through 6000 lost marks, of which those whose device is
// watched at a later deadline (a mark a scanner left behind) are not lost.
func TestPagingWatchedUnderSignals(t *testing.T) {
	const shards, n = 16, 100_000
	ctx, s, d := newDevices(t, shards, time.Minute)
	base := time.Now().Add(time.Hour).UnixMilli()
	ids := fleet(t, s, "dev", n, shards, base)
	// A tenth are typed, for the type filter.
	var ss []shard.Sighting
	for k := 0; k < n; k += 10 {
		ss = append(ss, shard.Sighting{ID: ids[k], Type: "meter"})
	}
	for _, r := range s.SeenMulti(ctx, ss, 0) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}

	sigCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var signals, added int
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for round := 0; sigCtx.Err() == nil; round++ {
			byShard := map[int][]shard.Entry{}
			for range 500 {
				id := ids[rng.IntN(n)]
				byShard[shard.Of(id, shards)] = append(byShard[shard.Of(id, shards)],
					shard.Entry{ID: id, Deadline: base + 10_000 + int64(round)})
			}
			// A few new devices a round: 300 in all keeps every ZSET
			// well below a resize.
			if added < 300 {
				for range 10 {
					id := fmt.Sprintf("new-%d", added)
					added++
					byShard[shard.Of(id, shards)] = append(byShard[shard.Of(id, shards)], shard.Entry{ID: id, Deadline: base})
				}
			}
			if _, err := s.Upsert(sigCtx, shard.Deadlines, byShard); err != nil && !errors.Is(err, context.Canceled) {
				t.Error(err)
				return
			}
			signals += 500
		}
	})
	trips := shard.ListTrips()
	seen, pages, took := listAll(t, d, shard.DeviceQuery{State: shard.ListWatched, Limit: 1000}, nil)
	trips = shard.ListTrips() - trips
	stop()
	wg.Wait()
	var missing, dups []string
	for _, id := range ids {
		if seen[id] == 0 {
			missing = append(missing, id)
		}
	}
	for id, c := range seen {
		if c > 1 {
			dups = append(dups, id)
		}
	}
	t.Logf("watched: %d pages of 1000 over %d devices (+%d new) under %d signals: %.1f round trips and %v a page",
		pages, n, added, signals, float64(trips)/float64(pages), took/time.Duration(pages))
	if len(missing) > 0 || len(dups) > 0 {
		t.Fatalf("%d devices never listed (e.g. %.5v), %d listed more than once (e.g. %.5v)", len(missing), missing, len(dups), dups)
	}
	if signals == 0 {
		t.Fatal("no signal arrived while paging")
	}

	typed, _, _ := listAll(t, d, shard.DeviceQuery{Type: "meter", State: shard.ListWatched, Limit: 1000}, nil)
	if len(typed) != n/10 {
		t.Errorf("type=meter listed %d devices, want %d", len(typed), n/10)
	}

	// 6000 lost marks, of devices not watched; 200 more whose devices are
	// watched at a later deadline.
	lost := make([]shard.Entry, 6000)
	for k := range lost {
		lost[k] = shard.Entry{ID: fmt.Sprintf("lost-%d", k), Deadline: base - 60_000}
	}
	stale := make([]shard.Entry, 200)
	for k := range stale {
		stale[k] = shard.Entry{ID: ids[k], Deadline: base - 60_000}
	}
	_, errs := s.LostMarks().SwapMulti(ctx, append(lost, stale...), base-59_000)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	trips = shard.ListTrips()
	got, pages, took := listAll(t, d, shard.DeviceQuery{State: shard.ListLost, Limit: 1000}, nil)
	trips = shard.ListTrips() - trips
	t.Logf("lost: %d pages over %d marks: %.1f round trips and %v a page", pages, len(lost)+len(stale),
		float64(trips)/float64(pages), took/time.Duration(pages))
	if len(got) != len(lost) {
		t.Errorf("state=lost listed %d devices, want %d", len(got), len(lost))
	}
	for _, e := range lost {
		if got[e.ID] != 1 {
			t.Fatalf("%s listed %d times, want once", e.ID, got[e.ID])
		}
	}

	// Every known device: the watched, then the lost.
	everything, _, _ := listAll(t, d, shard.DeviceQuery{Limit: 1000}, nil)
	if want := n + added + len(lost); len(everything) != want {
		t.Errorf("no state listed %d devices, want %d", len(everything), want)
	}
}

// TestPagingAcrossDoubling lists while the shards double and the devices
// move to their new shards, the way writers and the drain move them: no
// device present throughout goes unlisted.
func TestPagingAcrossDoubling(t *testing.T) {
	const shards, n = 4, 4000
	ctx, s, d := newDevices(t, shards, time.Minute)
	base := time.Now().Add(time.Hour).UnixMilli()
	ids := fleet(t, s, "dev", n, shards, base)
	doubled := false
	seen, _, _ := listAll(t, d, shard.DeviceQuery{State: shard.ListWatched, Limit: 300}, func(page int) {
		if page != 3 || doubled {
			return
		}
		doubled = true
		if _, err := s.Double(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
		// Every moved device signals (written to its new shard) and the
		// drain removes it from its old one.
		for _, id := range ids {
			from, to := shard.Of(id, shards), shard.Of(id, 2*shards)
			if from == to {
				continue
			}
			upsert(t, s, to, shard.Entry{ID: id, Deadline: base + 5000})
			if _, err := s.Remove(ctx, shard.Deadlines, from, id); err != nil {
				t.Fatal(err)
			}
		}
	})
	if !doubled {
		t.Fatal("the listing ended before the doubling")
	}
	for _, id := range ids {
		if seen[id] == 0 {
			t.Fatalf("%s was never listed", id)
		}
	}
}

// TestListRefusesBadQueries: a malformed cursor, one of another listing, a
// limit out of range and an unknown state are refused.
func TestListRefusesBadQueries(t *testing.T) {
	ctx, s, d := newDevices(t, 4, time.Minute)
	fleet(t, s, "dev", 500, 4, time.Now().Add(time.Hour).UnixMilli())
	_, lostNext, err := d.List(ctx, shard.DeviceQuery{State: shard.ListWatched, Limit: 10})
	if err != nil || lostNext == "" {
		t.Fatalf("first page: next %q, err %v", lostNext, err)
	}
	for _, q := range []shard.DeviceQuery{
		{Cursor: "!!!"}, {Cursor: "eyJ2Ijo5OX0"}, {State: shard.ListLost, Cursor: lostNext},
	} {
		if _, _, err := d.List(ctx, q); !errors.Is(err, shard.ErrBadCursor) {
			t.Errorf("%+v: err %v, want ErrBadCursor", q, err)
		}
	}
	for _, q := range []shard.DeviceQuery{{Limit: 1001}, {Limit: -1}, {State: "gone"}} {
		if _, _, err := d.List(ctx, q); !errors.Is(err, shard.ErrBadQuery) {
			t.Errorf("%+v: err %v, want ErrBadQuery", q, err)
		}
	}
}
