package shard_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

func newStore(t *testing.T) *shard.Store {
	t.Helper()
	env := testenv.New(t, testenv.Options{})
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{env.Redis.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return shard.NewStore(c, shard.NewKeys("sw"))
}

// TestMemberWatermark proves invariant 6 for several ingest members: a
// shared group has consumed only up to its slowest member, a member outside
// any group stands on its own, a dead member holds the watermark back only
// until its timeout, and the gap it leaves is recorded as an outage.
func TestMemberWatermark(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	base := time.UnixMilli(1_700_000_000_000)
	const timeout, gap = 10 * time.Second, 3 * time.Second
	a := shard.Member{Group: "g", ID: "a"}
	b := shard.Member{Group: "g", ID: "b"}
	adv := func(m shard.Member, at time.Duration, now time.Duration) int64 {
		t.Helper()
		wm, err := s.AdvanceMember(ctx, m, base.Add(at).UnixMilli(), base.Add(now), timeout, gap)
		if err != nil {
			t.Fatal(err)
		}
		return wm
	}
	want := func(got int64, at time.Duration) {
		t.Helper()
		if w := base.Add(at).UnixMilli(); got != w {
			t.Fatalf("watermark = base%+dms, want base%+dms", got-base.UnixMilli(), w-base.UnixMilli())
		}
	}
	want(adv(a, 0, 0), 0)
	want(adv(b, time.Second, time.Second), 0) // a is the slowest of the group
	want(adv(a, 2*time.Second, 2*time.Second), time.Second)
	// b dies at 1s; a keeps going. The group waits for b until its timeout.
	want(adv(a, 5*time.Second, 5*time.Second), time.Second)
	want(adv(a, 11*time.Second, 11*time.Second), time.Second)
	want(adv(a, 12*time.Second, 12*time.Second), 12*time.Second) // b dropped
	_, outs, err := s.Watermark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 1 || outs[0].Start != base.Add(time.Second).UnixMilli() || outs[0].End != base.Add(12*time.Second).UnixMilli() {
		t.Fatalf("outages = %+v, want one from base+1s to base+12s", outs)
	}
	// A member outside any group consumes everything: it alone moves the
	// watermark while the group lags.
	solo := shard.Member{ID: "solo"}
	want(adv(solo, 20*time.Second, 20*time.Second), 20*time.Second)
	if err := s.LeaveMember(ctx, solo); err != nil {
		t.Fatal(err)
	}
	ms, err := s.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ms["|solo"]; ok || len(ms) != 1 {
		t.Fatalf("members after leave = %v, want only g|a", ms)
	}
}

// TestHeadAndScore reads single entries back through plain commands, whose
// replies differ from the scripts' (RESP3 pairs).
func TestHeadAndScore(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if _, ok, err := s.Head(ctx, shard.Deadlines, 3); err != nil || ok {
		t.Fatalf("head of empty shard: ok %v err %v, want none", ok, err)
	}
	es := []shard.Entry{{ID: "b", Deadline: 2000}, {ID: "a", Deadline: 1000}}
	if _, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{3: es}); err != nil {
		t.Fatal(err)
	}
	h, ok, err := s.Head(ctx, shard.Deadlines, 3)
	if err != nil || !ok || h != es[1] {
		t.Fatalf("head = %+v %v %v, want %+v", h, ok, err, es[1])
	}
	if d, ok, err := s.Score(ctx, shard.Deadlines, 3, "b"); err != nil || !ok || d != 2000 {
		t.Fatalf("score of b = %d %v %v, want 2000", d, ok, err)
	}
}
