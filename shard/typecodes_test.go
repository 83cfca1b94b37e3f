package shard_test

import (
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestTypeCodes: a type is stored as a small code, read back as the type
// by any process, and a process that moves to a new generation (Redis lost
// the codes and a restore assigned new ones) does not decode with the old.
func TestTypeCodes(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	ctx := t.Context()
	a, b := env.Store(t, "sw"), env.Store(t, "sw")
	ss := a.SeenMulti(ctx, []shard.Sighting{{ID: "d1", Type: "sensor"}, {ID: "d2", Type: "meter"}, {ID: "d3"}}, 1)
	for _, d := range ss {
		if d.Err != nil {
			t.Fatal(d.Err)
		}
	}
	for _, s := range []*shard.Store{a, b} {
		types, err := s.Types(ctx, []string{"d1", "d2", "d3", "unknown"})
		if err != nil {
			t.Fatal(err)
		}
		if types[0] != "sensor" || types[1] != "meter" || types[2] != "" || types[3] != "" {
			t.Fatalf("types read back: %q", types)
		}
	}
	// Redis loses everything; a restore writes the devices again, and the
	// codes come out the other way round.
	if err := env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	a.SetGeneration("g2")
	b.SetGeneration("g2")
	// The first command on a connection to the killed Redis may fail; a
	// restore is written again until it sticks, as the guard does.
	testenv.WaitFor(t, 10*time.Second, "the restore written", func() bool {
		return a.RestoreRegistry(ctx, []shard.Restored{{ID: "d2", Type: "meter"}, {ID: "d1", Type: "sensor"}}) == nil
	})
	types, err := b.Types(ctx, []string{"d1", "d2"})
	if err != nil {
		t.Fatal(err)
	}
	if types[0] != "sensor" || types[1] != "meter" {
		t.Fatalf("types after the restore, read by another process: %q", types)
	}
}
