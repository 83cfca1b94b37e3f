package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/bench/doubling"
	"github.com/sigwatch/sigwatch/shard"
)

// doubling is scenario 7: ingest-path write throughput before, during and
// after a shard doubling (16 → 32), with a scanner draining the old shards.
// The baseline is the same writers' throughput just before the doubling,
// so the ratios are the dip (during ÷ before) and the recovery (after ÷
// before). It runs rounds times, each on a fresh installation; every
// measure keeps its best round. A round's before always precedes its
// during and after, so there is no order to alternate.
func (r *runner) doubling(ctx context.Context) error {
	opts := doubling.Options{
		Devices:   r.prof.DoublingDevices,
		Writers:   writeWriters,
		Batch:     writeBatch,
		Threshold: r.prof.DoublingThreshold,
		Phase:     r.prof.DoublingPhase,
		Shards:    shards,
	}
	sc := Scenario{ID: 7, Name: "doubling", Title: "Write throughput across a shard doubling",
		Baselines: []string{fmt.Sprintf("the same writers just before the doubling: %d ingest-like writers (`shard.Writer.Upsert` "+
			"batches of %d random ids of %d devices, each absent id recorded in the registry as ingest's first-seen path does), "+
			"measured for %s after a warm-up; the doubling and the drain are measured from the same running writers.",
			opts.Writers, opts.Batch, opts.Devices, opts.Phase)}}
	var rs []doubling.Result
	for round := range rounds {
		if err := r.e.flush(ctx); err != nil {
			return err
		}
		opts.Store = shard.NewStore(r.e.rc, shard.NewKeys("sw"))
		r.p.Printf("doubling", "round %d of %d: %d devices, %d writers, threshold %s: measuring before, during and after %d → %d",
			round+1, rounds, opts.Devices, opts.Writers, opts.Threshold, shards, 2*shards)
		t := time.Now()
		res, err := doubling.Measure(ctx, opts)
		if err != nil {
			return fmt.Errorf("round %d: %w", round+1, err)
		}
		r.p.Printf("doubling", "round %d of %d: %s; the round took %s", round+1, rounds, res, time.Since(t).Round(100*time.Millisecond))
		rs = append(rs, res)
	}
	if err := r.e.flush(ctx); err != nil {
		return err
	}
	before := doublingRuns(rs, func(x doubling.Result) float64 { return x.Before })
	during := doublingRuns(rs, func(x doubling.Result) float64 { return x.During })
	afters := doublingRuns(rs, func(x doubling.Result) float64 { return x.After })
	drains := doublingRuns(rs, func(x doubling.Result) float64 { return x.Drain.Seconds() })
	best := rs[slices.Index(during, slices.Max(during))]
	fired := make([]string, len(rs))
	for j, x := range rs {
		fired[j] = strconv.FormatInt(x.Fired, 10)
	}
	what := fmt.Sprintf("%d → %d", best.From, best.To)
	how := fmt.Sprintf("best of %d rounds, each a fresh %d-shard installation doubled to %d", rounds, best.From, best.To)
	dip := newFigure("writes/s during a "+what+" doubling (until drained)", "/s", slices.Max(during), "before the doubling", slices.Max(before))
	dip.Detail = fmt.Sprintf("%s: during %s, before %s; %d first-seen registry writes during the drain of the best round (a moved "+
		"device is absent from its new shard once); timers that fell due over each round's measurement: %s (the writers pick "+
		"ids at random, so a device left unwritten for a threshold falls due and is first seen again; few means the threshold "+
		"was long enough for the write rate)", how, doublingRates(during), doublingRates(before), best.FirstSeen, strings.Join(fired, ", "))
	after := newFigure("writes/s after the doubling", "/s", slices.Max(afters), "before the doubling", slices.Max(before))
	after.Detail = fmt.Sprintf("%s: after %s, before %s", how, doublingRates(afters), doublingRates(before))
	drain := newFigure("drain time of the doubling", "s", slices.Min(drains), "", 0)
	drain.Detail = fmt.Sprintf("%s (the shortest drain): runs %s; from publishing %d shards until the old shards held no moved "+
		"device and the doubling ended; a moved device's old copy leaves when it falls due, so a drain lasts about a threshold "+
		"(%s here) plus the drain check", how, runs(drains, "s"), best.To, opts.Threshold)
	sc.Figures = append(sc.Figures, dip, after, drain)
	sc.Notes = append(sc.Notes, "Measured by `bench/doubling.Measure`: writers run at full speed throughout; the "+
		"doubling is started with `Store.Double` (as `sigwatch shards double` does) while a scanner owning every shard "+
		"applies the crossing rule and drains. No target in issue 5; the ratios say what a doubling costs the write path.",
		fmt.Sprintf("%d rounds, each on an emptied Redis: %s devices written once, then the measurement; each figure keeps "+
			"its best round (before, during and after the highest rate, the drain the shortest), so a ratio may set measures "+
			"of two rounds side by side.", rounds, groupThousands(int64(opts.Devices))))
	r.res.add(sc)
	return nil
}

// doublingRuns is one measure of every round.
func doublingRuns(rs []doubling.Result, of func(doubling.Result) float64) []float64 {
	vs := make([]float64, len(rs))
	for j, x := range rs {
		vs[j] = of(x)
	}
	return vs
}

// doublingRates lists rates, for a figure's detail.
func doublingRates(vs []float64) string {
	out := make([]float64, len(vs))
	for j, v := range vs {
		out[j] = math.Round(v)
	}
	return runs(out, "/s")
}
