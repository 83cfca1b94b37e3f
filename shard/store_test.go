package shard_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// redisStore returns a store on a fresh Redis.
func redisStore(t *testing.T) *shard.Store {
	t.Helper()
	env := testenv.New(t, testenv.Options{})
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{env.Redis.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return shard.NewStore(c, shard.NewKeys("sw"))
}

func upsert(t *testing.T, s *shard.Store, i int, es ...shard.Entry) {
	t.Helper()
	if _, err := s.Upsert(context.Background(), shard.Deadlines, map[int][]shard.Entry{i: es}); err != nil {
		t.Fatal(err)
	}
}

func acquire(t *testing.T, s *shard.Store, i int, owner string) shard.Lease {
	t.Helper()
	l, ok, err := s.Acquire(context.Background(), i, owner, time.Minute)
	if err != nil || !ok {
		t.Fatalf("acquire shard %d for %s: ok %v, err %v; want a lease", i, owner, ok, err)
	}
	return l
}

func score(t *testing.T, s *shard.Store, i int, id string) (int64, bool) {
	t.Helper()
	sc, ok, err := s.Score(context.Background(), shard.Deadlines, i, id)
	if err != nil {
		t.Fatal(err)
	}
	return sc, ok
}

// TestClaimReadsDueUpToHorizon proves a claim returns only members due at or
// before the horizon (invariant 1 at the script level), at most limit of
// them, earliest first, and the head of the shard.
func TestClaimReadsDueUpToHorizon(t *testing.T) {
	ctx := context.Background()
	s := redisStore(t)
	for k := range 10 {
		upsert(t, s, 3, shard.Entry{ID: fmt.Sprintf("d%d", k), Deadline: int64(1000 + 100*k)})
	}
	l := acquire(t, s, 3, "a")

	c, err := s.Claim(ctx, shard.Deadlines, 3, l, 1500, 100)
	due, head, hasHead := c.Due, c.Head, c.HasHead
	if err != nil {
		t.Fatal(err)
	}
	want := []shard.Entry{{"d0", 1000}, {"d1", 1100}, {"d2", 1200}, {"d3", 1300}, {"d4", 1400}, {"d5", 1500}}
	if !slices.Equal(due, want) {
		t.Errorf("got due %v, want %v", due, want)
	}
	if !hasHead || head != (shard.Entry{ID: "d0", Deadline: 1000}) {
		t.Errorf("got head %v (%v), want d0@1000", head, hasHead)
	}

	c, err = s.Claim(ctx, shard.Deadlines, 3, l, 1500, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Due) != 2 {
		t.Errorf("got %d due with limit 2, want 2", len(c.Due))
	}

	c, err = s.Claim(ctx, shard.Deadlines, 3, l, 999, 100)
	due, head, hasHead = c.Due, c.Head, c.HasHead
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 0 || !hasHead || head.Deadline != 1000 {
		t.Errorf("before the head: got due %v head %v, want none due and head at 1000", due, head)
	}

	l4 := acquire(t, s, 4, "a")
	if c, err := s.Claim(ctx, shard.Deadlines, 4, l4, 1<<50, 100); err != nil || len(c.Due) != 0 || c.HasHead {
		t.Errorf("empty shard: got due %v, head %v, err %v; want nothing", c.Due, c.HasHead, err)
	}
}

// TestSettleComparesBeforeRemoving proves invariant 4: settle removes a
// fired member only if its score is still the claimed one; a member reset in
// between survives with its new deadline and is reported revived. Moves are
// compare-and-move.
func TestSettleComparesBeforeRemoving(t *testing.T) {
	ctx := context.Background()
	s := redisStore(t)
	upsert(t, s, 0, shard.Entry{"kept", 100}, shard.Entry{"reset", 100}, shard.Entry{"moved", 100}, shard.Entry{"movereset", 100})
	l := acquire(t, s, 0, "a")
	c, err := s.Claim(ctx, shard.Deadlines, 0, l, 100, 10)
	if err != nil || len(c.Due) != 4 {
		t.Fatalf("claim: got %v, %v; want 4 due", c.Due, err)
	}

	// Resets land between claim and settle (ZADD GT, as ingest writes them).
	upsert(t, s, 0, shard.Entry{"reset", 5000}, shard.Entry{"movereset", 7000})

	st, err := s.Settle(ctx, shard.Deadlines, 0, l,
		[]shard.Entry{{"kept", 100}, {"reset", 100}, {"gone", 100}},
		[]shard.Move{{ID: "moved", From: 100, To: 900}, {ID: "movereset", From: 100, To: 900}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Removed != 1 || st.Moved != 1 {
		t.Errorf("got removed %d moved %d, want 1 and 1", st.Removed, st.Moved)
	}
	if want := []shard.Entry{{"reset", 5000}}; !slices.Equal(st.Revived, want) {
		t.Errorf("got revived %v, want %v", st.Revived, want)
	}
	for id, want := range map[string]int64{"reset": 5000, "moved": 900, "movereset": 7000} {
		if got, ok := score(t, s, 0, id); !ok || got != want {
			t.Errorf("%s: got score %d (present %v), want %d", id, got, ok, want)
		}
	}
	if _, ok := score(t, s, 0, "kept"); ok {
		t.Errorf("kept: still present after settle, want removed")
	}
}

// TestFencing proves invariant 5: once a lease has moved to another owner,
// the old holder can neither claim, settle nor renew, and nothing changes.
func TestFencing(t *testing.T) {
	ctx := context.Background()
	s := redisStore(t)
	upsert(t, s, 1, shard.Entry{"x", 100}, shard.Entry{"y", 200})
	old := acquire(t, s, 1, "a")

	if _, ok, err := s.Acquire(ctx, 1, "b", time.Minute); ok || err != nil {
		t.Fatalf("second acquire: got ok %v err %v, want refused while held", ok, err)
	}
	// The lease expires (here: deleted) and b takes it.
	if err := s.ExpireLease(ctx, 1); err != nil {
		t.Fatal(err)
	}
	cur := acquire(t, s, 1, "b")
	if cur.Token() <= old.Token() {
		t.Errorf("got token %d after %d, want a larger one", cur.Token(), old.Token())
	}

	if _, err := s.Claim(ctx, shard.Deadlines, 1, old, 1000, 10); !errors.Is(err, shard.ErrNotOwner) {
		t.Errorf("claim with the old lease: got %v, want ErrNotOwner", err)
	}
	if _, err := s.Settle(ctx, shard.Deadlines, 1, old, []shard.Entry{{"x", 100}}, []shard.Move{{ID: "y", From: 200, To: 5000}}); !errors.Is(err, shard.ErrNotOwner) {
		t.Errorf("settle with the old lease: got %v, want ErrNotOwner", err)
	}
	if err := s.Renew(ctx, old, time.Minute); !errors.Is(err, shard.ErrNotOwner) {
		t.Errorf("renew of the old lease: got %v, want ErrNotOwner", err)
	}
	if err := s.Release(ctx, old); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Owner(ctx, 1); v != cur.Value {
		t.Errorf("after the old holder's release: owner %q, want %q (untouched)", v, cur.Value)
	}
	if got, ok := score(t, s, 1, "x"); !ok || got != 100 {
		t.Errorf("x: got %d (present %v), want 100 untouched", got, ok)
	}
	if got, ok := score(t, s, 1, "y"); !ok || got != 200 {
		t.Errorf("y: got %d (present %v), want 200 untouched", got, ok)
	}

	if err := s.Release(ctx, cur); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Owner(ctx, 1); v != "" {
		t.Errorf("after release: owner %q, want free", v)
	}
}

// TestLeaseExpires proves a lease that is not renewed frees the shard, so a
// dead replica's shards can be taken over within the lease time.
func TestLeaseExpires(t *testing.T) {
	ctx := context.Background()
	s := redisStore(t)
	l, ok, err := s.Acquire(ctx, 0, "a", 200*time.Millisecond)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := s.Renew(ctx, l, 200*time.Millisecond); err != nil {
		t.Fatalf("renew: %v", err)
	}
	testenv.WaitFor(t, 2*time.Second, "the lease to expire", func() bool {
		_, ok, err := s.Acquire(ctx, 0, "b", time.Minute)
		return err == nil && ok
	})
}

// TestWatermarkRecordsOutages proves the watermark only moves forward and a
// jump larger than the gap is recorded as an outage (invariant 6's input).
func TestWatermarkRecordsOutages(t *testing.T) {
	ctx := context.Background()
	s := redisStore(t)
	if wm, outs, err := s.Watermark(ctx); err != nil || wm != 0 || len(outs) != 0 {
		t.Fatalf("fresh: got %d %v %v, want 0 and no outages", wm, outs, err)
	}
	gap := time.Second
	for _, ms := range []int64{10_000, 10_500, 10_200, 11_000, 15_000, 15_100} {
		if _, err := s.AdvanceWatermark(ctx, ms, gap); err != nil {
			t.Fatal(err)
		}
	}
	wm, outs, err := s.Watermark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if wm != 15_100 {
		t.Errorf("got watermark %d, want 15100", wm)
	}
	if want := []shard.Outage{{11_000, 15_000}}; !slices.Equal(outs, want) {
		t.Errorf("got outages %v, want %v", outs, want)
	}
}

// TestHeartbeatMembership proves live replicas are listed sorted, a silent
// one drops out after its ttl, and Leave removes one at once.
func TestHeartbeatMembership(t *testing.T) {
	ctx := context.Background()
	s := redisStore(t)
	now := time.UnixMilli(1_700_000_000_000)
	for _, r := range []string{"c", "a"} {
		if _, err := s.Heartbeat(ctx, r, now, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	live, err := s.Heartbeat(ctx, "b", now.Add(time.Second), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c"}; !slices.Equal(live, want) {
		t.Errorf("got live %v, want %v", live, want)
	}
	live, _ = s.Heartbeat(ctx, "b", now.Add(5500*time.Millisecond), 5*time.Second)
	if want := []string{"b"}; !slices.Equal(live, want) {
		t.Errorf("after a and c went silent: got %v, want %v", live, want)
	}
	if err := s.Leave(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	live, _ = s.Heartbeat(ctx, "d", now.Add(6*time.Second), 5*time.Second)
	if want := []string{"d"}; !slices.Equal(live, want) {
		t.Errorf("after b left: got %v, want %v", live, want)
	}
}

// TestUpsertReportsAbsentIDsOnce proves the write path's contract: deadlines
// only move forward (ZADD GT), the ids absent before the write are returned
// once each, even when an id appears twice in a batch or a batch spans the
// script's chunks, and a repeated write is idempotent and reports nothing.
func TestUpsertReportsAbsentIDsOnce(t *testing.T) {
	s := redisStore(t)
	ctx := context.Background()
	const n = 2500 // more members than the script handles per chunk
	var present []shard.Entry
	for j := 0; j < n; j += 2 {
		present = append(present, shard.Entry{ID: fmt.Sprintf("d%04d", j), Deadline: 5000})
	}
	upsert(t, s, 0, present...)

	es := make([]shard.Entry, 0, n+2)
	for j := range n {
		es = append(es, shard.Entry{ID: fmt.Sprintf("d%04d", j), Deadline: int64(1000 + 10*j)})
	}
	// Twice in the batch: absent before, so reported once, at its later deadline.
	es = append(es, shard.Entry{ID: "d0001", Deadline: 9000}, shard.Entry{ID: "d2499", Deadline: 1})
	added, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: es})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(added)
	var want []string
	for j := 1; j < n; j += 2 {
		want = append(want, fmt.Sprintf("d%04d", j))
	}
	if !slices.Equal(added, want) {
		t.Fatalf("got %d added ids (first %v), want the %d absent ones once each", len(added), added[:min(3, len(added))], len(want))
	}
	for _, c := range []struct {
		id   string
		want int64
	}{{"d0000", 5000}, {"d0400", 5000}, {"d0402", 5020}, {"d0001", 9000}, {"d2499", 1000 + 10*2499}, {"d0003", 1030}} {
		if got, ok := score(t, s, 0, c.id); !ok || got != c.want {
			t.Errorf("deadline of %s: got %d (present %v), want %d", c.id, got, ok, c.want)
		}
	}
	again, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: es})
	if err != nil || len(again) != 0 {
		t.Errorf("repeated upsert: got %d added, err %v; want none", len(again), err)
	}

	// Present ids given twice take the native path at their later deadline;
	// an absent id beside a repeated present one is still reported.
	dup := []shard.Entry{{ID: "d0000", Deadline: 7000}, {ID: "d0002", Deadline: 8000}, {ID: "d0000", Deadline: 7500}}
	if added, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: dup}); err != nil || len(added) != 0 {
		t.Errorf("upsert of present ids given twice: got added %v, err %v; want none", added, err)
	}
	dup = append(dup, shard.Entry{ID: "fresh", Deadline: 100}, shard.Entry{ID: "d0000", Deadline: 9999})
	if added, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: dup}); err != nil || !slices.Equal(added, []string{"fresh"}) {
		t.Errorf("upsert beside a repeated present id: got added %v, err %v; want [fresh]", added, err)
	}
	for id, want := range map[string]int64{"d0000": 9999, "d0002": 8000, "fresh": 100} {
		if got, ok := score(t, s, 0, id); !ok || got != want {
			t.Errorf("deadline of %s: got %d (present %v), want %d", id, got, ok, want)
		}
	}
}

// TestSeenMulti proves what a batch of sightings records for each device:
// a typed device gets an entry, an untyped new one costs none, a lost mark
// is cleared and handed back once.
func TestSeenMulti(t *testing.T) {
	s := redisStore(t)
	ctx := context.Background()
	if err := s.MarkLost(ctx, "was-lost", 1234, 1300); err != nil {
		t.Fatal(err)
	}
	ss := s.SeenMulti(ctx, []shard.Sighting{{ID: "typed", Type: "sensor"}, {ID: "plain"}, {ID: "was-lost"}}, 5000)
	for _, d := range ss {
		if d.Err != nil {
			t.Fatalf("%s: %v", d.ID, d.Err)
		}
	}
	if ss[0].Existed || ss[1].Existed || !ss[2].Existed || ss[2].Prev.LostDeadline != 1234 {
		t.Fatalf("first sighting: got %+v; want only was-lost existing, with its mark", ss)
	}
	devs, err := s.Devices(ctx, []string{"typed", "plain", "was-lost"})
	if err != nil {
		t.Fatal(err)
	}
	if devs[0].Type != "sensor" || devs[0].FirstSeen != 5000 || devs[1] != (shard.Device{}) || devs[2].LostDeadline != 0 {
		t.Fatalf("registry after the sighting: got %+v", devs)
	}
	ss = s.SeenMulti(ctx, []shard.Sighting{{ID: "typed"}, {ID: "was-lost"}}, 6000)
	if !ss[0].Existed || ss[0].Prev.Type != "sensor" || ss[1].Prev.LostDeadline != 0 {
		t.Fatalf("second sighting: got %+v; want typed existing and no mark left to hand back", ss)
	}
}
