package bench

import (
	"context"
	"fmt"

	"github.com/sigwatch/sigwatch/bench/doubling"
	"github.com/sigwatch/sigwatch/shard"
)

// doubling is scenario 7: ingest-path write throughput before, during and
// after a shard doubling (16 → 32), with a scanner draining the old shards.
// The baseline is the same writers' throughput just before the doubling,
// so the ratios are the dip (during ÷ before) and the recovery (after ÷
// before).
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
	if err := r.e.flush(ctx); err != nil {
		return err
	}
	opts.Store = shard.NewStore(r.e.rc, shard.NewKeys("sw"))
	r.p.Printf("doubling", "%d devices, %d writers, threshold %s: measuring before, during and after %d → %d",
		opts.Devices, opts.Writers, opts.Threshold, shards, 2*shards)
	res, err := doubling.Measure(ctx, opts)
	if err != nil {
		return err
	}
	r.p.Printf("doubling", "%s", res)
	if err := r.e.flush(ctx); err != nil {
		return err
	}
	what := fmt.Sprintf("%d → %d", res.From, res.To)
	dip := newFigure("writes/s during a "+what+" doubling (until drained)", "/s", res.During, "before the doubling", res.Before)
	dip.Detail = fmt.Sprintf("%d first-seen registry writes during the drain (a moved device is absent from its new shard once); "+
		"%d timers fell due over the whole measurement (the writers pick ids at random, so a device left unwritten for a "+
		"threshold falls due and is first seen again; few means the threshold was long enough for the write rate)",
		res.FirstSeen, res.Fired)
	after := newFigure("writes/s after the doubling", "/s", res.After, "before the doubling", res.Before)
	drain := newFigure("drain time of the doubling", "s", res.Drain.Seconds(), "", 0)
	drain.Detail = fmt.Sprintf("from publishing %d shards until the old shards held no moved device and the doubling ended; "+
		"a moved device's old copy leaves when it falls due, so a drain lasts about a threshold (%s here) plus the drain check",
		res.To, opts.Threshold)
	sc.Figures = append(sc.Figures, dip, after, drain)
	sc.Notes = append(sc.Notes, "Measured by `bench/doubling.Measure`: writers run at full speed throughout; the "+
		"doubling is started with `Store.Double` (as `sigwatch shards double` does) while a scanner owning every shard "+
		"applies the crossing rule and drains. No target in issue 5; the ratios say what a doubling costs the write path.")
	r.res.add(sc)
	return nil
}
