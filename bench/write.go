package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// writeBatch and writeWriters shape the write path: batches of 1,024 signals
// (64 per shard) from 4 concurrent writers, as ingest's 4 flushers send them
// when Redis is the bottleneck.
const (
	writeBatch   = 1024
	writeWriters = 4
)

// writePath is scenario 2: ingest's deadline writer (shard.Writer) fed
// directly, against the raw rueidis ceiling of variadic ZADD GT commands in
// DoMulti over the same keys and key space.
func (r *runner) writePath(ctx context.Context) error {
	sc := Scenario{ID: 2, Name: "write", Title: "Redis write path",
		Notes: []string{fmt.Sprintf("sigwatch's side is ingest's deadline writer (`shard.Writer.Upsert`: placement by "+
			"shard, one native variadic `ZADD XX GT CH` per shard in one `DoMulti` that pushes present ids forward; for a "+
			"shard where some id did not change, one native `ZMSCORE`, and the fenced Lua script only for ids found absent, "+
			"which adds them; it returns the new ids) fed batches "+
			"of %d random ids of the key space from %d goroutines, as ingest's flushers feed it, with no broker.",
			writeBatch, writeWriters)},
		Baselines: []string{fmt.Sprintf("raw rueidis ceiling: the same batches of %d random ids (grouped by shard into "+
			"%d keys holding %d ids) written as one variadic `ZADD GT` per shard in one `DoMulti`, from the same %d "+
			"goroutines; no script, no reply parsing beyond errors — the highest-throughput way to write these deadlines.",
			writeBatch, shards, r.prof.WriteDevices, writeWriters)}}
	if err := r.e.flush(ctx); err != nil {
		return err
	}
	store := shard.NewStore(r.e.rc, shard.NewKeys("sw"))
	ids := deviceIDs(r.prof.WriteDevices)
	far := time.Now().Add(time.Hour).UnixMilli()
	r.p.Printf("write", "preloading %d ids into %d shards", len(ids), shards)
	if err := preload(ctx, store, ids, func(int) int64 { return far }); err != nil {
		return err
	}
	swWrite, err := r.sigwatchWriter(ctx, store)
	if err != nil {
		return err
	}
	load := func(write writeFunc) *writeLoad {
		return &writeLoad{ids: ids, writers: writeWriters, batch: writeBatch, ahead: 2 * time.Hour, write: write}
	}
	keys := shard.NewKeys("sw")
	// Each side keeps its best run: a noisy neighbour on the shared machine
	// then flatters neither.
	rawWrite := rawZaddWriter(r.e.rc, func(i int) string { return keys.Timers(shard.Deadlines, i) })
	var raw, sw measured
	var rawRuns, swRuns []float64
	// side runs a round of one side, keeping its best run in best and every
	// run's rate in rates; name and unit are for the progress line.
	side := func(write writeFunc, name, unit string, best *measured, rates *[]float64) func(int) error {
		return func(int) error {
			m := r.measureWrites(ctx, load(write), r.prof.WriteFor)
			r.p.Printf("write", "%s: %.0f %ss/s (client %.2f µs, redis %.2f µs per %s)", name, m.Rate, unit, m.ClientCPUus, m.RedisCPUus, unit)
			*rates = append(*rates, m.Rate)
			if m.Rate > best.Rate {
				*best = m
			}
			return ctx.Err()
		}
	}
	err = alternate(rounds, side(rawWrite, "raw ZADD GT", "member", &raw, &rawRuns),
		side(swWrite, "sigwatch Upsert", "signal", &sw, &swRuns))
	if err != nil {
		return err
	}
	r.ceiling = raw.Rate
	f := newFigure("deadline writes/s", "/s", sw.Rate, "raw ZADD GT", raw.Rate, ratioAtLeast(0.9))
	f.Detail = fmt.Sprintf("client CPU %.2f vs %.2f µs per signal; Redis CPU %.2f vs %.2f µs per signal; %s (sigwatch %s; raw %s); errors %d vs %d",
		sw.ClientCPUus, raw.ClientCPUus, sw.RedisCPUus, raw.RedisCPUus, bestOf(rounds), runs(swRuns, "/s"), runs(rawRuns, "/s"), sw.Errors, raw.Errors)
	sc.Figures = append(sc.Figures, f)
	r.res.add(sc)
	return nil
}
