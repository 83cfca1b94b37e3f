package shard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestRestartStampedAgain: Runs tells a Redis that fsyncs every write
// (appendfsync always) from one that does not; after a restart Restarts
// names every shard with the process that stamped it and the one serving
// it, Restamp makes them claimable again under the same generation, and a
// Restamp from a stale reading (a second restart) is refused.
func TestRestartStampedAgain(t *testing.T) {
	env := testenv.New(t, testenv.Options{RedisPersist: true, RedisArgs: []string{"--appendfsync", "always"}})
	ctx, s := t.Context(), env.Store(t, "sw")
	if _, err := s.InitTopology(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateGeneration(ctx, "g1", time.Now().UnixMilli()); err != nil {
		t.Fatal(err)
	}
	if err := s.Vet(ctx, 4, "g1"); err != nil {
		t.Fatal(err)
	}
	s.SetGeneration("g1")
	runs, err := s.Runs(ctx)
	if err != nil || len(runs) != 1 || !runs[0].Durable || !runs[0].Master || runs[0].Replicated || runs[0].Addr != env.Redis.Addr {
		t.Fatalf("runs %+v, %v: want one durable master at %s", runs, err, env.Redis.Addr)
	}
	before := runs[0].ID
	if rs, err := s.Restarts(ctx, 4); err != nil || len(rs) != 0 {
		t.Fatalf("restarts before any: %+v, %v", rs, err)
	}

	restart := func() {
		t.Helper()
		if err := env.Redis.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := env.Redis.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	restart()
	var rs []shard.Restarted
	testenv.WaitFor(t, 10*time.Second, "the restart seen", func() bool {
		rs, err = s.Restarts(ctx, 4)
		return err == nil && len(rs) == 4
	})
	if rs[0].Was != before || rs[0].Now == before {
		t.Fatalf("restarted %+v, want from %s to another", rs[0], before)
	}
	if err := s.Vetted(ctx, 4); !errors.Is(err, shard.ErrDataLoss) {
		t.Fatalf("vetted after a restart: %v, want ErrDataLoss", err)
	}
	restart()
	testenv.WaitFor(t, 10*time.Second, "Redis back", func() bool { _, err := s.Runs(ctx); return err == nil })
	if err := s.Restamp(ctx, rs); !errors.Is(err, shard.ErrDataLoss) {
		t.Fatalf("restamp proven for a process no longer serving: %v, want ErrDataLoss", err)
	}
	if rs, err = s.Restarts(ctx, 4); err != nil || len(rs) != 4 {
		t.Fatalf("restarts after the second restart: %+v, %v", rs, err)
	}
	if err := s.Restamp(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if err := s.Vetted(ctx, 4); err != nil {
		t.Fatalf("not vetted after the restamp: %v", err)
	}
	if s.Generation() != "g1" {
		t.Fatalf("generation %q after the restamp, want g1", s.Generation())
	}

	// A shard of another generation is no restart.
	if err := s.Vet(ctx, 1, "g2"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Restarts(ctx, 4); !errors.Is(err, shard.ErrDataLoss) {
		t.Fatalf("restarts with a shard of another generation: %v, want ErrDataLoss", err)
	}

	// everysec acknowledges before the disk has it.
	everysec := testenv.New(t, testenv.Options{RedisPersist: true})
	runs, err = everysec.Store(t, "sw").Runs(ctx)
	if err != nil || len(runs) != 1 || runs[0].Durable || !runs[0].AOF {
		t.Fatalf("runs of an everysec Redis %+v, %v: want one with AOF, not durable", runs, err)
	}
}
