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
