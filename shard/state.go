package shard

import (
	"context"
	"fmt"
	"strconv"
	"time"

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
// the caller read, and keeps the partition's open-alarm index in step: the
// new value is indexed when the caller says it is open, unindexed when not.
//
// KEYS[1]: state HASH of the device's registry partition
// KEYS[2]: open index of the partition
// ARGV[1]: device id
// ARGV[2]: the value read ("" when there was none)
// ARGV[3]: the new value
// ARGV[4]: "1" if the new value is open, else "0"
// Returns: 1 if replaced, 0 if the state changed meanwhile.
var casStateScript = newScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if cur ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 1`)

// CompareAndSwapState replaces id's state with next if it is still old (""
// for none) and reports whether it did; open says whether next belongs in
// the open index (OpenStates), which changes in the same step. It is not
// retried: a transition that lost its race must read the state again and
// decide anew.
func (s *Store) CompareAndSwapState(ctx context.Context, id, old, next string, open bool) (bool, error) {
	flag := "0"
	if open {
		flag = "1"
	}
	n, err := casStateScript.exec(ctx, s.c, []string{s.k.state(id), s.k.open(id)}, []string{id, old, next, flag}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("shard: write state: %w", err)
	}
	return n == 1, nil
}

// indexStateScript sets one device's entry of the open index from its
// state, if the state is still the value the caller judged.
//
// KEYS[1]: state HASH of the partition; KEYS[2]: its open index
// ARGV[1]: device id; ARGV[2]: the state judged ("" for none);
// ARGV[3]: "1" if it is open
// Returns: 1 if the entry was set, 0 if the state changed meanwhile (its
// writer kept the index).
var indexStateScript = newScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if cur ~= ARGV[2] then return 0 end
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[2], ARGV[1], cur)
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 1`)

// OpenIndexBuilt returns when the open index was last built on this Redis
// (unix ms, by the builder's clock); ok is false if it never was.
func (s *Store) OpenIndexBuilt(ctx context.Context) (at int64, ok bool, err error) {
	v, err := s.c.Do(ctx, s.c.B().Get().Key(s.k.OpenIndexBuilt()).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("shard: read open index marker: %w", err)
	}
	return v, true, nil
}

// BuildOpenIndex makes the open index of every partition agree with the
// states, judging each with open, and then marks it built. It scans every
// state once, 32 partitions at a time, and may run beside transitions and
// other builders: each entry is set only if its state is still the one
// judged (a transition that changed it kept the index itself). Stale
// entries (no state, or a state no longer open) are removed the same way.
// now is when the build started, recorded in the marker.
func (s *Store) BuildOpenIndex(ctx context.Context, open func(state string) bool, now time.Time) error {
	// A few partitions at a time: their states are held in memory.
	const batch = 32
	for lo := 0; lo < registryParts; lo += batch {
		parts := make([]int, 0, batch)
		for p := lo; p < min(lo+batch, registryParts); p++ {
			parts = append(parts, p)
		}
		states, indexed := map[string]string{}, map[string]string{}
		if err := s.scanPartsIn(ctx, stateName, parts, func(id, v string) { states[id] = v }); err != nil {
			return err
		}
		if err := s.scanPartsIn(ctx, openName, parts, func(id, v string) { indexed[id] = v }); err != nil {
			return err
		}
		var execs []rueidis.LuaExec
		fix := func(id, state string, isOpen bool) {
			flag := "0"
			if isOpen {
				flag = "1"
			}
			execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.state(id), s.k.open(id)}, Args: []string{id, state, flag}})
		}
		for id, v := range states {
			isOpen := open(v)
			if iv, ok := indexed[id]; isOpen && iv != v || !isOpen && ok {
				fix(id, v, isOpen)
			}
		}
		for id := range indexed {
			if _, ok := states[id]; !ok {
				fix(id, "", false)
			}
		}
		for _, r := range indexStateScript.execMulti(ctx, s.c, execs...) {
			if err := r.Error(); err != nil {
				return fmt.Errorf("shard: build open index: %w", err)
			}
		}
	}
	if err := s.c.Do(ctx, s.c.B().Set().Key(s.k.OpenIndexBuilt()).Value(strconv.FormatInt(now.UnixMilli(), 10)).Build()).Error(); err != nil {
		return fmt.Errorf("shard: mark open index built: %w", err)
	}
	return nil
}

// OpenStates calls fn with every entry of the open index: the states of the
// open alarms, without reading the idle ones.
func (s *Store) OpenStates(ctx context.Context, fn func(id, state string)) error {
	return s.scanParts(ctx, openName, fn)
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
		parts := make([]int, 0, stateScanParts)
		for p := lo; p < min(lo+stateScanParts, registryParts); p++ {
			parts = append(parts, p)
		}
		if err := s.scanPartsIn(ctx, name, parts, fn); err != nil {
			return err
		}
	}
	return nil
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
