package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// memory is scenario 5: Redis memory per watched device in steady state
// (used_memory delta / devices), against a bare ZSET holding the same ids
// and scores.
func (r *runner) memory(ctx context.Context) error {
	n := r.prof.WriteDevices
	sc := Scenario{ID: 5, Name: "memory", Title: "Redis memory per watched device",
		Baselines: []string{fmt.Sprintf("bare ZSET: one key holding the same %d ids with the same scores, written with "+
			"variadic `ZADD`; the least any Redis design that keeps a deadline per device can hold.", n)}}
	ids := deviceIDs(n)
	base := time.Now().Add(time.Hour).UnixMilli()
	score := func(j int) int64 { return base + int64(j) }
	store := shard.NewStore(r.e.rc, shard.NewKeys("sw"))

	if err := r.e.flush(ctx); err != nil {
		return err
	}
	m0, err := r.e.usedMemory(ctx)
	if err != nil {
		return err
	}
	r.p.Printf("memory", "sigwatch: %d devices into %d shards, then the registry", n, shards)
	if err := preload(ctx, store, ids, score); err != nil {
		return err
	}
	m1, err := r.e.usedMemory(ctx)
	if err != nil {
		return err
	}
	// What ingest records when a device of the default type is first
	// seen, then what it records for a device with a type.
	if err := preloadRegistry(ctx, store, ids, ""); err != nil {
		return err
	}
	m2, err := r.e.usedMemory(ctx)
	if err != nil {
		return err
	}
	if err := preloadRegistry(ctx, store, ids, "sensor"); err != nil {
		return err
	}
	mTyped, err := r.e.usedMemory(ctx)
	if err != nil {
		return err
	}

	if err := r.e.flush(ctx); err != nil {
		return err
	}
	m3, err := r.e.usedMemory(ctx)
	if err != nil {
		return err
	}
	r.p.Printf("memory", "bare ZSET: %d ids", n)
	err = parallelChunks(ctx, n, 1000, 4, func(lo, hi int) error {
		c := r.e.rc.B().Zadd().Key("bare").ScoreMember()
		for j := lo; j < hi; j++ {
			c = c.ScoreMember(float64(score(j)), ids[j])
		}
		return r.e.rc.Do(ctx, c.Build()).Error()
	})
	if err != nil {
		return err
	}
	m4, err := r.e.usedMemory(ctx)
	if err != nil {
		return err
	}
	if card, err := r.e.rc.Do(ctx, r.e.rc.B().Zcard().Key("bare").Build()).AsInt64(); err != nil || card != int64(n) {
		return fmt.Errorf("bare ZSET holds %d ids, want %d (%v)", card, n, err)
	}
	if err := r.e.flush(ctx); err != nil {
		return err
	}

	per := func(a, b int64) float64 { return float64(b-a) / float64(n) }
	untyped, typed, deadlines, bare := per(m0, m2), per(m0, mTyped), per(m0, m1), per(m3, m4)
	r.p.Printf("memory", "sigwatch %.1f B/device untyped, %.1f B typed (deadlines %.1f), bare ZSET %.1f B", untyped, typed, deadlines, bare)
	size := groupThousands(int64(n))
	f := newFigure(fmt.Sprintf("bytes per device of the default type (%s devices)", size), "B", untyped, "bare ZSET", bare, ratioAtMost(1.1))
	f.Detail = fmt.Sprintf("deadline shards %.1f B + registry %.1f B per device", deadlines, untyped-deadlines)
	ft := newFigure(fmt.Sprintf("bytes per device with a device type (%s devices)", size), "B", typed, "bare ZSET", bare, ratioAtMost(1.1))
	ft.Detail = fmt.Sprintf("deadline shards %.1f B + registry %.1f B per device", deadlines, typed-deadlines)
	sc.Figures = append(sc.Figures, f, ft)
	note := "Besides its deadline, ingest records a device in the registry (a HASH field per device, JSON, in 1,024 " +
		"partitions) when it is first seen; the first row is what that costs for devices of the default type, the " +
		"second gives every device the type `sensor`."
	if untyped-deadlines < 1 {
		note += " At this commit a device of the default type is not written to the registry at all."
	}
	sc.Notes = append(sc.Notes, note)
	r.res.add(sc)
	return nil
}
