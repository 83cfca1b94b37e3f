package alarm

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// The alarm's own data in Redis: the open index kept by the state's
// compare-and-set, and the send slots of the rate limits.

func openState(v int) string { return fmt.Sprintf(`{"v":%d,"phase":"active"}`, v) }
func idleState(v int) string { return fmt.Sprintf(`{"v":%d,"phase":""}`, v) }

// dropIndex deletes the open index and its marker, as on an installation
// from before the index, leaving a stray entry for stray.
func dropIndex(ctx context.Context, s *shard.Store, stray string) error {
	k := s.Keys()
	cmds := []shard.Cmd{{Name: "DEL", Keys: []string{k.Meta(indexBuiltLeaf)}}}
	err := s.ScanParts(ctx, openLeaf, 0, shard.Parts, func(id, _ string) {
		cmds = append(cmds, shard.Cmd{Name: "HDEL", Keys: []string{k.InPart(id, openLeaf)}, Args: []string{id}})
	})
	if err != nil {
		return err
	}
	cmds = append(cmds, shard.Cmd{Name: "HSET", Keys: []string{k.InPart(stray, openLeaf)}, Args: []string{stray, "stray"}})
	for _, r := range s.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

// TestOpenIndexFollowsStates: every compare-and-set keeps the open index
// in step with the states, and a build from the states (an installation
// from before the index) makes it agree again, stray entries removed.
func TestOpenIndexFollowsStates(t *testing.T) {
	ctx, s := t.Context(), testenv.New(t, testenv.Options{}).Store(t, "sw")
	a := &Alarms{store: s}
	open := isOpen
	want := map[string]string{}
	cur := map[string]string{}
	set := func(id, v string) {
		t.Helper()
		ok, err := a.swapState(ctx, id, cur[id], v, open(v))
		if err != nil || !ok {
			t.Fatalf("cas %s -> %s: %v %v", id, v, ok, err)
		}
		cur[id] = v
		delete(want, id)
		if open(v) {
			want[id] = v
		}
	}
	check := func(when string) {
		t.Helper()
		got := map[string]string{}
		if err := a.openStates(ctx, func(id, v string) { got[id] = v }); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: open index %v, want %v", when, got, want)
		}
	}
	for k := range 300 {
		set(fmt.Sprintf("d-%d", k), openState(1))
	}
	for k := 0; k < 300; k += 3 {
		set(fmt.Sprintf("d-%d", k), idleState(2))
	}
	for k := 1; k < 300; k += 3 {
		set(fmt.Sprintf("d-%d", k), openState(3))
	}
	// A compare-and-set that lost its race changes neither.
	if ok, err := a.swapState(ctx, "d-2", idleState(0), openState(9), true); ok || err != nil {
		t.Fatalf("stale cas: %v %v", ok, err)
	}
	check("after transitions")

	if err := dropIndex(ctx, s, "stray"); err != nil {
		t.Fatal(err)
	}
	if _, built, err := a.indexBuilt(ctx); err != nil || built {
		t.Fatalf("built after drop: %v %v", built, err)
	}
	start := time.Now()
	if err := a.buildIndex(ctx, start); err != nil {
		t.Fatal(err)
	}
	if at, built, err := a.indexBuilt(ctx); err != nil || !built || at != start.UnixMilli() {
		t.Fatalf("after a build: built %v at %d, %v; want built at %d", built, at, err, start.UnixMilli())
	}
	check("after a build")
	listed := map[string]string{}
	for q := (shard.PartQuery{Leaf: openLeaf, Limit: 7}); ; {
		rows, next, err := s.ListParts(ctx, q)
		if err != nil || len(rows) > q.Limit {
			t.Fatalf("ListParts: %d rows, %v", len(rows), err)
		}
		for _, r := range rows {
			if _, dup := listed[r.Field]; dup {
				t.Fatalf("%s listed twice", r.Field)
			}
			listed[r.Field] = r.Value
		}
		if q.Cursor = next; next == "" {
			break
		}
	}
	if fmt.Sprint(listed) != fmt.Sprint(want) {
		t.Fatalf("ListParts listed %v, want %v", listed, want)
	}
}

// TestRateKeys checks that the rate limits' keys share the hash tag {rate},
// so that one script reserves across types on a Redis Cluster.
func TestRateKeys(t *testing.T) {
	k := shard.NewKeys("sw")
	if got := k.Tagged(rateTag, rateTypeLeaf+"meter"); got != "sw:{rate}:type:meter" {
		t.Errorf("type key = %q, want sw:{rate}:type:meter", got)
	}
	if got := k.Tagged(rateTag, rateTotalLeaf); got != "sw:{rate}:total" {
		t.Errorf("total key = %q, want sw:{rate}:total", got)
	}
}

// TestReserveSlots proves the pacing the alarm's rate limits rely on, on a
// single Redis and on a Redis Cluster: slots of one type are one emission
// interval apart with no burst beyond the first, types are paced apart
// from each other, the total interval holds across types, a reservation
// never gets a slot before now, and a type idle for long starts again at
// now.
func TestReserveSlots(t *testing.T) {
	for name, s := range testenv.SingleAndCluster(t, "sw") {
		t.Run(name, func(t *testing.T) { checkReserveSlots(t, s) })
	}
}

func checkReserveSlots(t *testing.T, s *shard.Store) {
	ctx := t.Context()
	const now = 1_000_000
	reserve := func(now int64, per, all time.Duration, types ...string) []int64 {
		t.Helper()
		v, err := (&Alarms{store: s}).reserveSlots(ctx, now, types, per, all)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got, want := reserve(now, 100*time.Millisecond, 0, "a", "a", "b", "a"), []int64{now, now + 100, now, now + 200}; !slices.Equal(got, want) {
		t.Errorf("per type: slots %v, want %v", got, want)
	}
	// A later call goes on from the TAT, not from its own now.
	if got, want := reserve(now+50, 100*time.Millisecond, 0, "a", "b"), []int64{now + 300, now + 100}; !slices.Equal(got, want) {
		t.Errorf("per type, later: slots %v, want %v", got, want)
	}
	// Idle long enough: back to now.
	if got, want := reserve(now+10_000, 100*time.Millisecond, 0, "a"), []int64{now + 10_000}; !slices.Equal(got, want) {
		t.Errorf("after idle: slots %v, want %v", got, want)
	}
	// A total cap paces the types together; each type's own TAT holds too.
	const t0 = 2_000_000
	if got, want := reserve(t0, 100*time.Millisecond, 60*time.Millisecond, "c", "d", "c", "d"), []int64{t0, t0 + 60, t0 + 120, t0 + 180}; !slices.Equal(got, want) {
		t.Errorf("total: slots %v, want %v", got, want)
	}
	if got, want := reserve(t0, 100*time.Millisecond, 60*time.Millisecond, "c"), []int64{t0 + 240}; !slices.Equal(got, want) {
		t.Errorf("total, next: slots %v, want %v", got, want)
	}
	// Only a total cap: no per-type key is needed.
	const t1 = 3_000_000
	if got, want := reserve(t1, 0, 250*time.Millisecond, "e", "e", "f"), []int64{t1, t1 + 250, t1 + 500}; !slices.Equal(got, want) {
		t.Errorf("total only: slots %v, want %v", got, want)
	}
	// Many types in one call stay on one slot of a cluster.
	var types []string
	for k := range 20 {
		types = append(types, strings.Repeat("x", k+1))
	}
	if got := reserve(4_000_000, 10*time.Millisecond, 0, types...); len(got) != 20 || got[19] != 4_000_000 {
		t.Errorf("20 types: slots %v, want 20 at now", got)
	}
}
