package shard

import (
	"context"
	"strconv"
	"strings"
	"time"
)

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

// Calls returns how many times Redis ran cmd (as INFO commandstats counts
// it, the calls from scripts included); for a single Redis.
func (s *Store) Calls(ctx context.Context, cmd string) int64 {
	info, err := s.c.Do(ctx, s.c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			return n
		}
	}
	return 0
}

// DropMember takes id out of group's membership, as a crash between the
// registry's write and the membership's would leave it.
func (s *Store) DropMember(ctx context.Context, group, id string) error {
	return s.c.Do(ctx, s.c.B().Srem().Key(s.k.GroupMembers(group)).Member(id).Build()).Error()
}

// OnMoveRead makes w run f in MoveTimers between reading the old copies
// and carrying them.
func (w *Writer) OnMoveRead(f func()) { w.moveRead = f }

// InGroup reports whether id is in the membership of group g.
func (s *Store) InGroup(ctx context.Context, g, id string) (bool, error) {
	return s.c.Do(ctx, s.c.B().Sismember().Key(s.k.GroupMembers(g)).Member(id).Build()).AsBool()
}

// Forget is forget, for the tests of package shard_test.
func (s *Store) Forget(ctx context.Context, id string) error { return s.forget(ctx, id) }

// Renew is renew, for the tests of package shard_test.
func (s *Store) Renew(ctx context.Context, l Lease, ttl time.Duration) error {
	return s.renew(ctx, l, ttl)
}

// UpsertAt is upsertAt, for the tests of package shard_test.
func (s *Store) UpsertAt(ctx context.Context, f Family, epoch int64, byShard map[int][]Entry, admit Admit) ([]string, []int, error) {
	return s.upsertAt(ctx, f, epoch, byShard, admit)
}

// Head is head, for the tests of package shard_test.
func (s *Store) Head(ctx context.Context, f Family, i int) (Entry, bool, error) {
	return s.head(ctx, f, i)
}

// CheckRedisVersion and InfoField are the version check's rule and reader.
var (
	CheckRedisVersion = checkRedisVersion
	InfoField         = infoField
)
