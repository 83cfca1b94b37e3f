package shard_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

func groupSize(t *testing.T, s *shard.Store, g string) int64 {
	t.Helper()
	n, err := s.GroupSize(t.Context(), g)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func setGroup(t *testing.T, s *shard.Store, id, g string) string {
	t.Helper()
	prev, err := s.SetGroup(t.Context(), id, g)
	if err != nil {
		t.Fatal(err)
	}
	return prev
}

func seen(t *testing.T, s *shard.Store, ss ...shard.Sighting) []shard.Sighting {
	t.Helper()
	out := s.SeenMulti(t.Context(), ss, time.Now().UnixMilli())
	for _, d := range out {
		if d.Err != nil {
			t.Fatalf("seen %s: %v", d.ID, d.Err)
		}
	}
	return out
}

func wantSizes(t *testing.T, s *shard.Store, want map[string]int64) {
	t.Helper()
	for g, n := range want {
		if got := groupSize(t, s, g); got != n {
			t.Errorf("GroupSize(%q) = %d, want %d", g, got, n)
		}
	}
}

func wantGroups(t *testing.T, s *shard.Store, ids []string, want []string) {
	t.Helper()
	got, err := s.Groups(t.Context(), ids)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("Groups(%v) = %q, want %q", ids, got, want)
	}
}

// TestSetGroupWritesOnlyOnChange: the registry is written when a device's
// group changes and not when it is set to the group it has; the group's
// membership follows every set, change and removal.
func TestSetGroupWritesOnlyOnChange(t *testing.T) {
	ctx, s := newStore(t)
	if prev := setGroup(t, s, "a", "gw-1"); prev != "" {
		t.Errorf("first SetGroup: prev = %q, want \"\"", prev)
	}
	setGroup(t, s, "b", "gw-1")
	wantSizes(t, s, map[string]int64{"gw-1": 2})

	hsets := s.Calls(ctx, "hset")
	for range 3 {
		if prev := setGroup(t, s, "a", "gw-1"); prev != "gw-1" {
			t.Errorf("same SetGroup: prev = %q, want gw-1", prev)
		}
	}
	if got := s.Calls(ctx, "hset"); got != hsets {
		t.Errorf("setting the same group 3 times: %d HSETs, want 0", got-hsets)
	}
	wantSizes(t, s, map[string]int64{"gw-1": 2})

	if prev := setGroup(t, s, "a", "gw-2"); prev != "gw-1" {
		t.Errorf("change: prev = %q, want gw-1", prev)
	}
	wantSizes(t, s, map[string]int64{"gw-1": 1, "gw-2": 1})
	wantGroups(t, s, []string{"a", "b", "c"}, []string{"gw-2", "gw-1", ""})

	if prev := setGroup(t, s, "a", ""); prev != "gw-2" {
		t.Errorf("removal: prev = %q, want gw-2", prev)
	}
	wantSizes(t, s, map[string]int64{"gw-1": 1, "gw-2": 0})
	wantGroups(t, s, []string{"a"}, []string{""})
}

// TestSightingsKeepGroups: a first-seen or back device records its group
// in the sighting's round trip and says the one it had; a sighting without
// a group keeps the one the device has; repeating a sighting heals a
// membership a crash left behind; removing the device takes it out of its
// group.
func TestSightingsKeepGroups(t *testing.T) {
	ctx, s, devs := newDevices(t, 4, time.Minute)
	got := seen(t, s, shard.Sighting{ID: "a", Type: "meter", Group: "gw-3"}, shard.Sighting{ID: "b", Group: "gw-3"}, shard.Sighting{ID: "c"})
	for _, d := range got {
		if d.Prev.Group != "" {
			t.Errorf("first sighting of %s: Prev.Group = %q, want \"\"", d.ID, d.Prev.Group)
		}
	}
	wantSizes(t, s, map[string]int64{"gw-3": 2})
	wantGroups(t, s, []string{"a", "b", "c"}, []string{"gw-3", "gw-3", ""})

	got = seen(t, s, shard.Sighting{ID: "b", Group: "gw-4"})
	if got[0].Prev.Group != "gw-3" {
		t.Errorf("moved sighting: Prev.Group = %q, want gw-3", got[0].Prev.Group)
	}
	wantSizes(t, s, map[string]int64{"gw-3": 1, "gw-4": 1})

	got = seen(t, s, shard.Sighting{ID: "b"})
	if got[0].Prev.Group != "gw-4" {
		t.Errorf("sighting without group: Prev.Group = %q, want gw-4", got[0].Prev.Group)
	}
	wantGroups(t, s, []string{"b"}, []string{"gw-4"})

	// A crash between the registry's write and the membership's.
	if err := s.DropMember(ctx, "gw-4", "b"); err != nil {
		t.Fatal(err)
	}
	wantSizes(t, s, map[string]int64{"gw-4": 0})
	seen(t, s, shard.Sighting{ID: "b", Group: "gw-4"})
	wantSizes(t, s, map[string]int64{"gw-4": 1})

	ds, err := s.Devices(ctx, []string{"a"})
	if err != nil || ds[0].Group != "gw-3" || ds[0].Type != "meter" {
		t.Errorf("Devices(a) = %+v, %v; want type meter, group gw-3", ds, err)
	}
	if _, err := devs.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	wantSizes(t, s, map[string]int64{"gw-3": 0})
	wantGroups(t, s, []string{"a"}, []string{""})
	if v, err := devs.Get(ctx, "a"); err != nil || v.Known() {
		t.Errorf("removed device: %+v, %v; want unknown", v, err)
	}
}

// TestGroupsOnRedisCluster: the group operations keep each command on one
// slot (a group's membership has a hash tag of its own), so they work on
// a Redis Cluster.
func TestGroupsOnRedisCluster(t *testing.T) {
	cluster := testenv.RedisClusterWith(t, servers.ClusterOptions{Masters: 3})
	s := testenv.StoreOn(t, cluster.Addrs, "sw")
	ctx := context.Background()
	k := shard.NewKeys("sw")
	if m := k.GroupMembers("gw-17"); !strings.Contains(m, "{g:gw-17}") {
		t.Errorf("membership key %q: want the hash tag {g:gw-17}", m)
	}
	var ids []string
	for _, id := range []string{"x1", "x2", "x3", "x4", "x5", "x6"} {
		ids = append(ids, id)
		seen(t, s, shard.Sighting{ID: id, Group: "site-" + string(id[1]%2+'0')})
	}
	wantSizes(t, s, map[string]int64{"site-0": 3, "site-1": 3})
	setGroup(t, s, "x1", "site-0")
	wantSizes(t, s, map[string]int64{"site-0": 4, "site-1": 2})
	wantGroups(t, s, ids, []string{"site-0", "site-0", "site-1", "site-0", "site-1", "site-0"})
	if err := s.Forget(ctx, "x2"); err != nil {
		t.Fatal(err)
	}
	wantSizes(t, s, map[string]int64{"site-0": 3})
}

// TestSightingRacingSetGroupLeavesOneMembership proves that a device
// belongs to exactly one group's membership, its own, however a sighting
// that records one group races PUT …/group setting another: 300 races of
// a sighting (group G, or keeping its group) against SetGroup H, from a
// device in group F. After each, the device's group is G or H, and only
// that group's membership holds it.
func TestSightingRacingSetGroupLeavesOneMembership(t *testing.T) {
	ctx, s := newStore(t)
	mismatches := 0
	for j := range 300 {
		id := "race-" + strings.Repeat("x", j%3) + string(rune('a'+j%26)) + time.Now().Format("150405.000000")
		setGroup(t, s, id, "F")
		sighting := shard.Sighting{ID: id}
		if j%2 == 0 {
			sighting.Group = "G"
		}
		done := make(chan error, 1)
		go func() {
			_, err := s.SetGroup(ctx, id, "H")
			done <- err
		}()
		out := s.SeenMulti(ctx, []shard.Sighting{sighting}, time.Now().UnixMilli())
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if out[0].Err != nil {
			t.Fatal(out[0].Err)
		}
		gs, err := s.Groups(ctx, []string{id})
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range []string{"F", "G", "H"} {
			in, err := s.InGroup(ctx, g, id)
			if err != nil {
				t.Fatal(err)
			}
			if in != (g == gs[0]) {
				if mismatches++; mismatches <= 5 {
					t.Errorf("race %d: device in group %q, in the membership of %q: %v", j, gs[0], g, in)
				}
			}
		}
	}
	if mismatches > 0 {
		t.Errorf("%d memberships disagree with their device's group after 300 races", mismatches)
	}
}
