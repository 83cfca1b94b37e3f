package shard

import (
	"fmt"
	"testing"
)

// TestDoublingMovesToPartnerOnly proves the property migration-free doubling
// rests on: from N to 2N a device stays at i or moves to exactly i+N.
func TestDoublingMovesToPartnerOnly(t *testing.T) {
	for n := 1; n <= 1024; n *= 2 {
		for k := 0; k < 2000; k++ {
			id := fmt.Sprintf("dev-%d", k)
			old, cur := Of(id, n), Of(id, 2*n)
			if cur != old && cur != old+n {
				t.Fatalf("%s: shard %d of %d became %d of %d, want %d or %d", id, old, n, cur, 2*n, old, old+n)
			}
			if moved := Hash(id)&uint64(n) != 0; moved != (cur == old+n) {
				t.Fatalf("%s: moved=%v, want hash&N!=0 to decide", id, cur == old+n)
			}
		}
	}
}

func TestValidCount(t *testing.T) {
	for _, n := range []int{1, 2, 16, 1024, MaxShards} {
		if err := ValidCount(n); err != nil {
			t.Errorf("ValidCount(%d) = %v, want nil", n, err)
		}
	}
	for _, n := range []int{0, -1, 3, 12, MaxShards * 2} {
		if ValidCount(n) == nil {
			t.Errorf("ValidCount(%d) = nil, want error", n)
		}
	}
}

// TestAssignEven checks that shards spread evenly and exactly once over
// replicas.
func TestAssignEven(t *testing.T) {
	live := []string{"a", "b", "c"}
	seen := map[int]string{}
	for _, r := range live {
		got := Assign(16, live, r)
		if len(got) < 5 || len(got) > 6 {
			t.Errorf("replica %s got %d shards, want 5 or 6", r, len(got))
		}
		for _, i := range got {
			if o, dup := seen[i]; dup {
				t.Fatalf("shard %d assigned to %s and %s", i, o, r)
			}
			seen[i] = r
		}
	}
	if len(seen) != 16 {
		t.Fatalf("%d shards assigned, want 16", len(seen))
	}
	if got := Assign(16, live, "zz"); got != nil {
		t.Errorf("unknown replica got %v, want none", got)
	}
}
