package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// memory is scenario 5: Redis memory per watched device in steady state
// (used_memory delta / devices), against a bare ZSET holding the same ids
// and scores.
func (r *runner) memory(ctx context.Context) error {
	sc := Scenario{ID: 5, Name: "memory", Title: "Redis memory per watched device",
		Baselines: []string{"bare ZSET: one key holding the same ids with the same scores, written with " +
			"variadic `ZADD`; the least any Redis design that keeps a deadline per device can hold."}}
	for k, n := range r.prof.MemoryDevices {
		if err := r.memoryAt(ctx, &sc, n, k == 0); err != nil {
			return err
		}
	}
	note := "Besides its deadline, ingest records a device in the registry when it is first seen: nothing for a device " +
		"of the default type, a small type code for one with a type (HASH fields in 65,536 small HASHes, which Redis " +
		"keeps compact up to 128 devices each, that is up to 8M typed devices). The first row of a size is what that costs for " +
		"devices of the default type, the second gives every device the type `sensor`. The durable registry, which " +
		"survives Redis losing data, lives in NATS, not in Redis."
	sc.Notes = append(sc.Notes, note)
	r.res.add(sc)
	return nil
}

// memoryAt measures the memory rows of n devices into sc, the durable
// registry's too if durableToo.
func (r *runner) memoryAt(ctx context.Context, sc *Scenario, n int, durableToo bool) error {
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

	var durable float64
	if durableToo {
		if durable, err = r.durableBytes(ctx, ids); err != nil {
			return err
		}
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
	ft := newFigure(fmt.Sprintf("bytes per device with a device type (%s devices)", size), "B", typed, "bare ZSET", bare, ratioAtMost(1.25))
	ft.Detail = fmt.Sprintf("deadline shards %.1f B + registry %.1f B per device", deadlines, typed-deadlines)
	sc.Figures = append(sc.Figures, f, ft)
	if durableToo {
		fd := newFigure(fmt.Sprintf("durable registry bytes per device, NATS KV (%s devices)", size), "B", durable, "bare ZSET in Redis", bare)
		fd.Detail = "file-backed JetStream KV bucket SIGWATCH_DEVICES, one record per device with its type; not Redis memory"
		sc.Figures = append(sc.Figures, fd)
	}
	return nil
}

// durableBytes records ids, with a type, in a fresh durable registry and
// returns its bytes per device, then removes the bucket.
func (r *runner) durableBytes(ctx context.Context, ids []string) (float64, error) {
	pub, err := dispatch.New(ctx, r.e.nc, dispatch.Options{Stream: "BENCHMEM", Prefix: "benchmem"})
	if err != nil {
		return 0, err
	}
	reg, err := pub.OpenRegistry(ctx)
	if err != nil {
		return 0, err
	}
	defer reg.Drop(context.WithoutCancel(ctx))
	r.p.Printf("memory", "durable registry: %d devices", len(ids))
	err = parallelChunks(ctx, len(ids), 1000, 4, func(lo, hi int) error {
		recs := make([]dispatch.DeviceRecord, 0, hi-lo)
		for _, id := range ids[lo:hi] {
			recs = append(recs, dispatch.DeviceRecord{ID: id, Type: "sensor"})
		}
		for _, err := range reg.Add(ctx, recs, func(*dispatch.DeviceRecord, bool) (bool, bool) { return false, false }) {
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	b, n, err := reg.Size(ctx)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("durable registry size: %d records, %v", n, err)
	}
	return float64(b) / float64(n), nil
}
