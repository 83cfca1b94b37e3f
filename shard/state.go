package shard

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// Per-device state is a value per device that a role keeps beside the
// registry, in the device's partition, and changes only by compare-and-set;
// the alarm keeps its state machine there. Mutes are the alarm's
// suppression windows. Shard stores both as opaque strings: what they mean
// is the role's business.

// State returns the state stored for id, "" when there is none.
func (s *Store) State(ctx context.Context, id string) (string, error) {
	v, err := s.c.Do(ctx, s.c.B().Hget().Key(s.k.state(id)).Field(id).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("shard: read state: %w", err)
	}
	return v, nil
}

// casStateScript replaces a device's state only if it is still the value
// the caller read.
//
// KEYS[1]: state HASH of the device's registry partition
// ARGV[1]: device id
// ARGV[2]: the value read ("" when there was none)
// ARGV[3]: the new value
// Returns: 1 if replaced, 0 if the state changed meanwhile.
var casStateScript = newScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if cur ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1`)

// CompareAndSwapState replaces id's state with next if it is still old (""
// for none) and reports whether it did. It is not retried: a transition
// that lost its race must read the state again and decide anew.
func (s *Store) CompareAndSwapState(ctx context.Context, id, old, next string) (bool, error) {
	n, err := casStateScript.exec(ctx, s.c, []string{s.k.state(id)}, []string{id, old, next}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("shard: write state: %w", err)
	}
	return n == 1, nil
}

// stateScanParts is how many partitions one round trip of ScanStates scans.
const stateScanParts = 128

// ScanStates calls fn with every device's state, partition by partition,
// each round trip scanning up to stateScanParts partitions at once. fn runs
// on the caller's goroutine. A state that changes during the scan may be
// seen once, twice or not at all, as with HSCAN.
func (s *Store) ScanStates(ctx context.Context, fn func(id, state string)) error {
	return s.scanParts(ctx, stateName, fn)
}

// scanParts calls fn with every field and value of the partition HASH named
// name, in every partition, each round trip scanning up to stateScanParts
// partitions at once.
func (s *Store) scanParts(ctx context.Context, name string, fn func(field, value string)) error {
	for lo := 0; lo < registryParts; lo += stateScanParts {
		cursors := make(map[int]uint64)
		for p := lo; p < min(lo+stateScanParts, registryParts); p++ {
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
	}
	return nil
}

// SetMute stores the mute id with value, replacing any mute of that id.
func (s *Store) SetMute(ctx context.Context, id, value string) error {
	return s.hashSet(ctx, s.k.Mutes(), id, value, "store mute")
}

// Mutes returns every stored mute, by id.
func (s *Store) Mutes(ctx context.Context) (map[string]string, error) {
	return s.hashAll(ctx, s.k.Mutes(), "mutes")
}

// DeleteMutes deletes the mutes ids and returns how many existed.
func (s *Store) DeleteMutes(ctx context.Context, ids ...string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	n, err := s.c.Do(ctx, s.c.B().Hdel().Key(s.k.Mutes()).Field(ids...).Build()).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("shard: delete mutes: %w", err)
	}
	return int(n), nil
}
