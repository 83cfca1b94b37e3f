package guard_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestRestorePutsGroupsBack: after Redis comes back empty, every device
// the registry knows in a group is in it again, live or lost, and each
// group counts its members as before.
func TestRestorePutsGroupsBack(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	g := r.guard(t)
	recs := []dispatch.DeviceRecord{{ID: "a", Group: "gw-1"}, {ID: "b", Type: "meter", Group: "gw-1"},
		{ID: "c", Group: "gw-1", LostDeadline: 1000, LostAt: 1001}, {ID: "d", Group: "gw-2"}, {ID: "e"}}
	r.add(t, recs)
	for _, rec := range recs {
		if _, err := r.store.SetGroup(ctx, rec.ID, rec.Group); err != nil {
			t.Fatal(err)
		}
	}
	stop := r.run(t, g)
	defer stop()
	r.empty(t)
	testenv.WaitFor(t, 20*time.Second, "the restore", func() bool {
		ok, _ := g.Ready()
		gen, found, err := r.store.Beat(ctx, time.Now().UnixMilli())
		return ok && found && err == nil && gen.ID == r.store.Generation()
	})
	ids := []string{"a", "b", "c", "d", "e"}
	got, err := r.store.Groups(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"gw-1", "gw-1", "gw-1", "gw-2", ""}; !slices.Equal(got, want) {
		t.Errorf("groups after the restore = %q, want %q", got, want)
	}
	for grp, want := range map[string]int64{"gw-1": 3, "gw-2": 1} {
		if n, err := r.store.GroupSize(ctx, grp); err != nil || n != want {
			t.Errorf("GroupSize(%q) after the restore = %d, %v; want %d", grp, n, err, want)
		}
	}
}
