package shard

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// An installation from before the durable registry and the generation
// keeps everything in Redis, its registry entries as JSON. KnownDevices
// finds every device it knows so the durable registry can be filled, and
// rewrites the entries in the current form.

// Known is a device Redis knows.
type Known struct {
	ID, Type     string
	Threshold    time.Duration
	LostDeadline int64
	LostAt       int64
	Alarm        string // the alarm's raw state
}

// legacyRegistry names the JSON registry HASH of each partition.
const legacyRegistry = "reg"

// alarmStates names the HASH of the alarm's per-device states in each
// partition (a leaf of the alarm's): an upgrade hands them, unread, to the
// durable registry with the rest of a device.
const alarmStates = "alarm"

// KnownDevices returns every device Redis knows under t: watched (a
// deadline in any shard of t), registered, lost, alarmed or with a
// threshold override. Registry entries in the old JSON form are written
// again as type codes, and the old HASHes deleted.
func (s *Store) KnownDevices(ctx context.Context, t Topology) (map[string]*Known, error) {
	out := map[string]*Known{}
	get := func(id string) *Known {
		k := out[id]
		if k == nil {
			k = &Known{ID: id}
			out[id] = k
		}
		return k
	}
	for i := range t.Shards {
		var cur uint64
		for {
			e, err := s.c.Do(ctx, s.c.B().Zscan().Key(s.k.Timers(Deadlines, i)).Cursor(cur).Count(1000).Build()).AsScanEntry()
			if err != nil {
				return nil, fmt.Errorf("shard: scan shard %d: %w", i, err)
			}
			for k := 0; k+1 < len(e.Elements); k += 2 {
				get(e.Elements[k])
			}
			if cur = e.Cursor; cur == 0 {
				break
			}
		}
	}
	var legacy []Restored
	err := s.scanParts(ctx, legacyRegistry, func(id, v string) {
		var d struct {
			Type string `json:"t"`
		}
		if json.Unmarshal([]byte(v), &d) == nil && d.Type != "" {
			get(id).Type = d.Type
			legacy = append(legacy, Restored{ID: id, Type: d.Type})
		}
	})
	if err != nil {
		return nil, err
	}
	err = s.LostMarks().All(ctx, func(id string, dl, at int64) {
		k := get(id)
		k.LostDeadline, k.LostAt = dl, at
	})
	if err != nil {
		return nil, err
	}
	if err := s.scanParts(ctx, alarmStates, func(id, v string) { get(id).Alarm = v }); err != nil {
		return nil, err
	}
	over, err := s.hashAll(ctx, s.k.Overrides(), "threshold overrides")
	if err != nil {
		return nil, err
	}
	for id, v := range over {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms > 0 {
			get(id).Threshold = time.Duration(ms) * time.Millisecond
		}
	}
	for lo := 0; lo < len(legacy); lo += 1000 {
		if err := s.RestoreRegistry(ctx, legacy[lo:min(lo+1000, len(legacy))]); err != nil {
			return nil, err
		}
	}
	for p := range registryParts {
		if err := s.c.Do(ctx, s.c.B().Unlink().Key(s.k.partKeyAt(p, legacyRegistry)).Build()).Error(); err != nil {
			return nil, fmt.Errorf("shard: remove the old registry: %w", err)
		}
	}
	return out, nil
}
