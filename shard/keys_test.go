package shard

import (
	"strings"
	"testing"
)

// TestKeysShareHashTag checks that every key of shard i carries {i}, so a
// script touching them stays on one Cluster slot.
func TestKeysShareHashTag(t *testing.T) {
	k := NewKeys("")
	for _, key := range []string{k.Timers(Deadlines, 7), k.Timers(Repeats, 7), k.Owner(7), k.Fence(7)} {
		if !strings.Contains(key, "{7}") || !strings.HasPrefix(key, "sw:") {
			t.Errorf("key %q: want prefix sw: and hash tag {7}", key)
		}
	}
	if want := k.partKey("a", "reg:"); !strings.HasPrefix(k.Registry("a"), want) {
		t.Errorf("registry key %q is not in the partition (%s...)", k.Registry("a"), want)
	}
	for _, key := range []string{k.Topology(), k.Watermark(), k.Outages(), k.Overrides(), k.OverridesVersion()} {
		if !strings.Contains(key, "{meta}") {
			t.Errorf("key %q: want hash tag {meta} so the watermark script stays on one slot", key)
		}
	}
}

// TestAlarmKeys checks that the alarm's repeat timers are a second sharded
// queue under the prefix's alarm space, and that a registry partition's key
// is the same whether named by an id or by its partition.
func TestAlarmKeys(t *testing.T) {
	k := NewKeys("sw")
	if got := k.Alarm().Timers(Repeats, 3); got != "sw:alarm:{3}:rp" {
		t.Errorf("alarm timer key = %q, want sw:alarm:{3}:rp", got)
	}
	if got := k.partKeyAt(Part("dev"), "alarm"); got != k.partKey("dev", "alarm") {
		t.Errorf("partKeyAt = %q, want partKey's %q", got, k.partKey("dev", "alarm"))
	}
}

// TestLeavesDoNotClash: no two leaves of the table name the same key under
// one hash tag, and no family of leaves takes in another leaf.
func TestLeavesDoNotClash(t *testing.T) {
	for j, a := range leaves {
		for _, b := range leaves[j+1:] {
			if a.tag != b.tag {
				continue
			}
			fam := func(f, n string) bool { return strings.HasSuffix(f, ":") && strings.HasPrefix(n, f) }
			if a.name == b.name || fam(a.name, b.name) || fam(b.name, a.name) {
				t.Errorf("leaves %q (%s) and %q (%s) clash under tag %q", a.name, a.owner, b.name, b.owner, a.tag)
			}
		}
	}
}

// TestEveryKeyIsALeaf: every key shard names is a leaf of the table, so
// the clash check covers them.
func TestEveryKeyIsALeaf(t *testing.T) {
	k := NewKeys("sw")
	l := k
	l.lease = ":timers"
	keys := []string{k.Timers(Deadlines, 1), k.Timers(Repeats, 1), k.Timers(Timers, 1), k.Wake(Deadlines, 1),
		k.Owner(1), l.Owner(1), k.Fence(1), l.Fence(1), k.TimerPayloads(1), k.TimersCarried(1), k.TimersFiring(1),
		k.Layout(1), k.Topology(), k.Generation(), k.RestoreLock(), k.CheckpointLock(), k.Watermark(), k.Outages(),
		k.Members(), k.Writers(), k.Drain(), k.Scanners(), l.Scanners(), k.Overrides(), k.OverridesVersion(),
		k.TypeCodes(), k.TimersFired("d"), k.Registry("d"), k.partKey("d", legacyRegistry), k.Lost("d"),
		k.ThresholdLock("d"), k.Group("d"), k.GroupMembers("g1")}
	for _, key := range keys {
		rest := strings.TrimPrefix(key, "sw:{")
		tag, name, ok := strings.Cut(rest, "}:")
		if !ok {
			t.Errorf("key %q has no hash tag", key)
			continue
		}
		switch {
		case strings.HasPrefix(tag, "r") && strings.Trim(tag[1:], "0123456789") == "":
			tag = "r"
		case strings.Trim(tag, "0123456789") == "":
			tag = "i"
		case strings.HasPrefix(tag, "g:"):
			tag = "g:"
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("key %q: %v", key, r)
				}
			}()
			known(tag, name)
		}()
	}
}
