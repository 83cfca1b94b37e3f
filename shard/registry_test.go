package shard_test

import (
	"testing"

	"github.com/sigwatch/sigwatch/shard"
)

// TestSeenMulti proves what a batch of sightings records for each device:
// a typed device gets an entry, an untyped new one costs none, a lost mark
// is cleared and handed back once.
func TestSeenMulti(t *testing.T) {
	ctx, s := newStore(t)
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
	if devs[0].Type != "sensor" || devs[1] != (shard.Device{}) || devs[2].LostDeadline != 0 {
		t.Fatalf("registry after the sighting: got %+v", devs)
	}
	ss = s.SeenMulti(ctx, []shard.Sighting{{ID: "typed"}, {ID: "was-lost"}}, 6000)
	if !ss[0].Existed || ss[0].Prev.Type != "sensor" || ss[1].Prev.LostDeadline != 0 {
		t.Fatalf("second sighting: got %+v; want typed existing and no mark left to hand back", ss)
	}
}
