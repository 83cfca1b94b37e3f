package shard

import "context"

// This file gives the tests of package shard_test what only tests need.

// Layout returns shard i's layout: the largest shard count writers may
// place it under and its floor epoch (0 when unset).
func (s *Store) Layout(ctx context.Context, i int) (shards int, floor int64, err error) {
	v, err := s.c.Do(ctx, s.c.B().Hmget().Key(s.k.Layout(i)).Field("shards", "floor").Build()).ToArray()
	if err != nil {
		return 0, 0, err
	}
	if len(v) == 2 {
		n, _ := v[0].AsInt64()
		floor, _ = v[1].AsInt64()
		shards = int(n)
	}
	return shards, floor, nil
}

// ExpireLease deletes shard i's lease, as its expiry would.
func (s *Store) ExpireLease(ctx context.Context, i int) error {
	return s.c.Do(ctx, s.c.B().Del().Key(s.k.Owner(i)).Build()).Error()
}

// ListTrips returns the round trips listings made so far in this process.
func ListTrips() int64 { return listTrips.Load() }
