package shard_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestRateKeys checks that the rate limits' keys share the hash tag {rate},
// so that one script reserves across types on a Redis Cluster.
func TestRateKeys(t *testing.T) {
	k := shard.NewKeys("sw")
	if got := k.RateType("meter"); got != "sw:{rate}:type:meter" {
		t.Errorf("RateType = %q, want sw:{rate}:type:meter", got)
	}
	if got := k.RateTotal(); got != "sw:{rate}:total" {
		t.Errorf("RateTotal = %q, want sw:{rate}:total", got)
	}
}

// TestReserveSlots proves the pacing the alarm's rate limits rely on, on a
// single Redis and on a Redis Cluster: slots of one type are one emission
// interval apart with no burst beyond the first, types are paced apart
// from each other, the total interval holds across types, a reservation
// never gets a slot before now, and a type idle for long starts again at
// now.
func TestReserveSlots(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	cluster := testenv.RedisCluster(t, 3)
	for name, s := range map[string]*shard.Store{
		"single":  env.Store(t, "sw"),
		"cluster": testenv.StoreOn(t, cluster.Addrs, "sw"),
	} {
		t.Run(name, func(t *testing.T) { checkReserveSlots(t, s) })
	}
}

func checkReserveSlots(t *testing.T, s *shard.Store) {
	ctx := t.Context()
	const now = 1_000_000
	reserve := func(now int64, per, all time.Duration, types ...string) []int64 {
		t.Helper()
		v, err := s.ReserveSlots(ctx, now, types, per, all)
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
