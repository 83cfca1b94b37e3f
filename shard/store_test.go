package shard_test

import (
	"context"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// newStore returns a store on a fresh Redis, its keys under the prefix sw,
// and the test's context.
func newStore(t *testing.T) (context.Context, *shard.Store) {
	t.Helper()
	return t.Context(), testenv.New(t, testenv.Options{}).Store(t, "sw")
}

// newDevices returns a store on a fresh Redis with shards shards and the
// devices on it, every device under the default threshold def.
func newDevices(t *testing.T, shards int, def time.Duration) (context.Context, *shard.Store, *shard.Devices) {
	t.Helper()
	ctx, s := newStore(t)
	if _, err := s.InitTopology(ctx, shards); err != nil {
		t.Fatal(err)
	}
	w, err := shard.NewWatcher(ctx, s, shards, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, s, shard.NewDevices(s, w, shard.NewThresholds(s, def, nil), nil)
}

func upsert(t *testing.T, s *shard.Store, i int, es ...shard.Entry) {
	t.Helper()
	if _, err := s.Upsert(t.Context(), shard.Deadlines, map[int][]shard.Entry{i: es}); err != nil {
		t.Fatal(err)
	}
}

func acquire(t *testing.T, s *shard.Store, i int, owner string) shard.Lease {
	t.Helper()
	l, ok, err := s.Acquire(t.Context(), i, owner, time.Minute)
	if err != nil || !ok {
		t.Fatalf("acquire shard %d for %s: ok %v, err %v; want a lease", i, owner, ok, err)
	}
	return l
}

func score(t *testing.T, s *shard.Store, i int, id string) (int64, bool) {
	t.Helper()
	sc, ok, err := s.Score(t.Context(), shard.Deadlines, i, id)
	if err != nil {
		t.Fatal(err)
	}
	return sc, ok
}
