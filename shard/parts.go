package shard

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// Some data lives in one HASH per registry partition (the lost marks, a
// role's per-device state): reading all of it is a scan of every
// partition, many partitions to a round trip.

// Parts is the number of registry partitions.
const Parts = registryParts

// partsPerTrip is how many partitions one round trip scans.
const partsPerTrip = 128

// ScanParts calls fn with every field and value of the partition HASH
// named leaf in partitions from to to-1, partsPerTrip partitions to a round
// trip. fn runs on the caller's goroutine. A field that changes during the
// scan may be seen once, twice or not at all, as with HSCAN.
func (s *Store) ScanParts(ctx context.Context, leaf string, from, to int, fn func(field, value string)) error {
	known("r", leaf)
	for lo := from; lo < to; lo += partsPerTrip {
		parts := make([]int, 0, partsPerTrip)
		for p := lo; p < min(lo+partsPerTrip, to); p++ {
			parts = append(parts, p)
		}
		if err := s.scanPartsIn(ctx, leaf, parts, fn); err != nil {
			return err
		}
	}
	return nil
}

// scanParts calls fn with every field and value of the partition HASH
// named name, in every partition.
func (s *Store) scanParts(ctx context.Context, name string, fn func(field, value string)) error {
	return s.ScanParts(ctx, name, 0, registryParts, fn)
}

// scanPartsIn calls fn with every field and value of the HASH named name in
// each partition of parts, scanning them all at once.
func (s *Store) scanPartsIn(ctx context.Context, name string, parts []int, fn func(field, value string)) error {
	cursors := make(map[int]uint64, len(parts))
	for _, p := range parts {
		cursors[p] = 0
	}
	for len(cursors) > 0 {
		parts := make([]int, 0, len(cursors))
		cmds := make(rueidis.Commands, 0, len(cursors))
		for p, cur := range cursors {
			parts = append(parts, p)
			// Pinned: rueidis retries a read-only command on a lost
			// connection and may recycle it while the dead
			// connection's writer still reads it.
			cmds = append(cmds, s.c.B().Hscan().Key(s.k.partKeyAt(p, name)).Cursor(cur).Count(1000).Build().Pin())
		}
		for j, r := range s.c.DoMulti(ctx, cmds...) {
			e, err := r.AsScanEntry()
			if err != nil {
				return fmt.Errorf("shard: scan %s: %w", name, err)
			}
			// The reply alternates field and value.
			for k := 0; k+1 < len(e.Elements); k += 2 {
				fn(e.Elements[k], e.Elements[k+1])
			}
			if e.Cursor == 0 {
				delete(cursors, parts[j])
			} else {
				cursors[parts[j]] = e.Cursor
			}
		}
	}
	return nil
}
