package shard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// A doubling moves the topology from N to 2N shards without copying
// anything: a device stays in shard i or moves to i+N. It runs in three
// steps, each one safe against writers and scanners that lag behind it:
//
//  1. Double raises the layout of every old shard to 2N, then publishes
//     shards = 2N, prev = N, epoch + 1. A scanner reads the layout with every
//     claim, so it checks moved members against their partner shard from the
//     first write placed under 2N on, whether or not it has seen the topology.
//  2. While prev != 0, writers switch as they notice; each reports the epoch
//     it writes with (ReportWriter). Once every live writer writes with the
//     current epoch, the owner of each old shard raises the shard's floor to
//     it (writes placed under an older topology are refused from then on, so
//     a writer that lagged, paused or was taken for dead cannot put a moved
//     device back), then counts the moved members left and reports them.
//  3. When every old shard has reported zero moved members after its floor
//     was raised, FinishDoubling clears prev and moves the epoch on.

// ErrDraining is returned by Double while the previous doubling drains.
var ErrDraining = errors.New("shard: a doubling is still draining")

// Double starts a doubling from N to 2N shards and returns the new
// topology. It refuses while a previous doubling drains and above
// MaxShards.
func (s *Store) Double(ctx context.Context, now time.Time) (Topology, error) {
	t, err := s.Topology(ctx)
	if err != nil {
		return Topology{}, err
	}
	if t.Draining() {
		return Topology{}, s.drainingErr(ctx, t)
	}
	if t.Shards*2 > MaxShards {
		return Topology{}, fmt.Errorf("shard: double: %d shards is the most sigwatch supports; the topology stays at %d", MaxShards, t.Shards)
	}
	// The layouts go up first: a writer can place a device under 2N only
	// after reading the topology published below, so every claim after
	// such a write sees the layout.
	to := strconv.Itoa(2 * t.Shards)
	execs := make([]rueidis.LuaExec, t.Shards)
	for i := range t.Shards {
		execs[i] = rueidis.LuaExec{Keys: []string{s.k.Layout(i)}, Args: []string{"shards", to}}
	}
	for _, r := range raiseScript.ExecMulti(ctx, s.c, execs...) {
		if err := r.Error(); err != nil {
			return Topology{}, fmt.Errorf("shard: double: raise shard layouts: %w", err)
		}
	}
	err = doubleScript.Exec(ctx, s.c, []string{s.k.Topology()}, []string{strconv.FormatInt(t.Epoch, 10),
		strconv.FormatInt(now.UnixMilli(), 10), strconv.Itoa(MaxShards)}).Error()
	if err != nil {
		switch msg := err.Error(); {
		case strings.HasPrefix(msg, "DRAINING"):
			if cur, rerr := s.Topology(ctx); rerr == nil {
				return Topology{}, s.drainingErr(ctx, cur)
			}
			return Topology{}, ErrDraining
		case strings.HasPrefix(msg, "CHANGED"):
			return Topology{}, errors.New("shard: double: the topology changed while doubling (another doubling started?); see `sigwatch shards status`")
		}
		return Topology{}, fmt.Errorf("shard: double: %w", err)
	}
	return s.Topology(ctx)
}

// drainingErr says which doubling is draining and how far it got.
func (s *Store) drainingErr(ctx context.Context, t Topology) error {
	left := "unknown number of"
	if reports, err := s.DrainReports(ctx); err == nil && len(reports) > 0 {
		var moved int64
		for _, r := range reports {
			if r.Epoch == t.Epoch {
				moved += r.Moved
			}
		}
		left = strconv.FormatInt(moved, 10)
	}
	return fmt.Errorf("%w: a doubling from %d to %d is still draining (%s moved devices left); wait for it to finish — see `sigwatch shards status`",
		ErrDraining, t.Prev, t.Shards, left)
}

// FinishDoubling ends the doubling in force at epoch if every old shard has
// reported itself drained for it. It reports whether it ended it.
func (s *Store) FinishDoubling(ctx context.Context, epoch int64, now time.Time) (bool, error) {
	n, err := finishScript.Exec(ctx, s.c, []string{s.k.Topology(), s.k.Drain()},
		[]string{strconv.FormatInt(epoch, 10), strconv.FormatInt(now.UnixMilli(), 10)}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("shard: finish doubling: %w", err)
	}
	return n == 1, nil
}

// RaiseFloor refuses, from now on, writes to shard i placed under a
// topology older than epoch.
func (s *Store) RaiseFloor(ctx context.Context, i int, epoch int64) error {
	err := raiseScript.Exec(ctx, s.c, []string{s.k.Layout(i)}, []string{"floor", strconv.FormatInt(epoch, 10)}).Error()
	if err != nil {
		return fmt.Errorf("shard: raise floor of shard %d: %w", i, err)
	}
	return nil
}

// Layout returns shard i's layout: the largest shard count writers may
// place it under and its floor epoch (0 when unset).
func (s *Store) Layout(ctx context.Context, i int) (shards int, floor int64, err error) {
	v, err := s.c.Do(ctx, s.c.B().Hmget().Key(s.k.Layout(i)).Field("shards", "floor").Build()).ToArray()
	if err != nil {
		return 0, 0, fmt.Errorf("shard: layout of shard %d: %w", i, err)
	}
	if len(v) == 2 {
		n, _ := v[0].AsInt64()
		floor, _ = v[1].AsInt64()
		shards = int(n)
	}
	return shards, floor, nil
}

// scanCount is the COUNT hint of the ZSCANs that look for moved members.
const scanCount = 1000

// CountMoved counts the members of shard i, in every family, that belong to
// another shard among n: the moved devices an old shard still holds. When
// first is set it stops at the first one found.
func (s *Store) CountMoved(ctx context.Context, i, n int, first bool) (int64, error) {
	var moved int64
	for _, f := range Families {
		key := s.k.Timers(f, i)
		cursor := uint64(0)
		for {
			e, err := s.c.Do(ctx, s.c.B().Zscan().Key(key).Cursor(cursor).Count(scanCount).Build()).AsScanEntry()
			if err != nil {
				return moved, fmt.Errorf("shard: scan shard %d: %w", i, err)
			}
			// The reply alternates member and score.
			for j := 0; j < len(e.Elements); j += 2 {
				if Of(e.Elements[j], n) != i {
					moved++
					if first {
						return moved, nil
					}
				}
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return moved, nil
}

// DrainReport is what the owner of an old shard last found in it.
type DrainReport struct {
	Epoch int64 // the topology epoch the shard was checked under
	Moved int64 // moved members left, over every family
	// Floored says the shard's floor was raised to Epoch before the check,
	// so Moved can only go down: a report with Moved 0 means drained.
	Floored bool
	At      int64 // when, unix ms
}

// Drained reports whether the report says its shard is drained for epoch.
func (r DrainReport) Drained(epoch int64) bool { return r.Epoch == epoch && r.Moved == 0 && r.Floored }

// ReportDrain records what the check of old shard i found.
func (s *Store) ReportDrain(ctx context.Context, i int, r DrainReport) error {
	floored := "0"
	if r.Floored {
		floored = "1"
	}
	v := strconv.FormatInt(r.Epoch, 10) + ":" + strconv.FormatInt(r.Moved, 10) + ":" + floored + ":" + strconv.FormatInt(r.At, 10)
	if err := s.c.Do(ctx, s.c.B().Hset().Key(s.k.Drain()).FieldValue().FieldValue(strconv.Itoa(i), v).Build()).Error(); err != nil {
		return fmt.Errorf("shard: report drain of shard %d: %w", i, err)
	}
	return nil
}

// DrainReports returns the drain reports of the doubling in force, by shard.
func (s *Store) DrainReports(ctx context.Context) (map[int]DrainReport, error) {
	m, err := s.c.Do(ctx, s.c.B().Hgetall().Key(s.k.Drain()).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("shard: read drain reports: %w", err)
	}
	out := make(map[int]DrainReport, len(m))
	for k, v := range m {
		i, err := strconv.Atoi(k)
		p := strings.Split(v, ":")
		if err != nil || len(p) != 4 {
			continue
		}
		var r DrainReport
		r.Epoch, _ = strconv.ParseInt(p[0], 10, 64)
		r.Moved, _ = strconv.ParseInt(p[1], 10, 64)
		r.Floored = p[2] == "1"
		r.At, _ = strconv.ParseInt(p[3], 10, 64)
		out[i] = r
	}
	return out, nil
}

// WriterTimeout is how long a writer's report counts: a writer silent for
// longer is taken for gone, and the drain no longer waits for it. Should it
// come back, the floors refuse what it placed under an old topology.
const WriterTimeout = 10 * time.Second

// WriterReport is the epoch a writer writes with, and when it said so.
type WriterReport struct {
	Epoch int64
	At    int64 // unix ms
}

// ReportWriter records that writer name writes with epoch or later.
func (s *Store) ReportWriter(ctx context.Context, name string, epoch int64, now time.Time) error {
	v := strconv.FormatInt(epoch, 10) + ":" + strconv.FormatInt(now.UnixMilli(), 10)
	if err := s.c.Do(ctx, s.c.B().Hset().Key(s.k.Writers()).FieldValue().FieldValue(name, v).Build()).Error(); err != nil {
		return fmt.Errorf("shard: report writer %s: %w", name, err)
	}
	return nil
}

// LeaveWriter removes a writer that stopped writing.
func (s *Store) LeaveWriter(ctx context.Context, name string) error {
	if err := s.c.Do(ctx, s.c.B().Hdel().Key(s.k.Writers()).Field(name).Build()).Error(); err != nil {
		return fmt.Errorf("shard: leave writer %s: %w", name, err)
	}
	return nil
}

// Writers returns every writer's last report.
func (s *Store) Writers(ctx context.Context) (map[string]WriterReport, error) {
	m, err := s.c.Do(ctx, s.c.B().Hgetall().Key(s.k.Writers()).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("shard: read writers: %w", err)
	}
	out := make(map[string]WriterReport, len(m))
	for name, v := range m {
		a, b, _ := strings.Cut(v, ":")
		var r WriterReport
		r.Epoch, _ = strconv.ParseInt(a, 10, 64)
		r.At, _ = strconv.ParseInt(b, 10, 64)
		out[name] = r
	}
	return out, nil
}

// WritersCurrent reports whether every writer heard from within
// WriterTimeout of now writes with epoch or later, and names the ones that
// do not.
func WritersCurrent(reports map[string]WriterReport, epoch int64, now time.Time) (ok bool, lagging []string) {
	for name, r := range reports {
		if r.At < now.Add(-WriterTimeout).UnixMilli() {
			continue
		}
		if r.Epoch < epoch {
			lagging = append(lagging, name)
		}
	}
	return len(lagging) == 0, lagging
}
