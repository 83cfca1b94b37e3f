package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/guard"
	"github.com/sigwatch/sigwatch/shard"
)

// checkpointLost is the share of devices marked lost when the checkpoint
// runs: what it copies into the durable registry.
const checkpointLost = 100 // one in

// checkpoint is scenario 11: the durable registry's checkpoint, which one
// process runs every 5 minutes (guard.DefaultCheckpoint): it reads every
// lost mark from Redis, walks every record of the registry and writes the
// marks that changed. Its cost grows with the fleet, not with the losses.
// Against the walk alone: one ordered-consumer read of every record of the
// same bucket.
func (r *runner) checkpoint(ctx context.Context) error {
	n := r.prof.CheckpointDevices
	size := groupThousands(int64(n))
	sc := Scenario{ID: 11, Name: "checkpoint", Title: "The durable registry's checkpoint",
		Baselines: []string{fmt.Sprintf("the registry walk alone: every record of the same bucket (%s devices) read once "+
			"through one ordered JetStream consumer, as the checkpoint reads it, and decoded.", size)}}
	if err := r.e.flush(ctx); err != nil {
		return err
	}
	store := shard.NewStore(r.e.rc, shard.NewKeys("sw"))
	topo, err := shard.NewWatcher(ctx, store, shards, 500*time.Millisecond, nil)
	if err != nil {
		return err
	}
	// A bucket of its own (BENCHCP_DEVICES), dropped at the end.
	pub, err := dispatch.New(ctx, r.e.nc, dispatch.Options{Stream: "BENCHCP", Prefix: "benchcp"})
	if err != nil {
		return err
	}
	reg, err := pub.OpenRegistry(ctx)
	if err != nil {
		return err
	}
	defer reg.Drop(context.WithoutCancel(ctx))
	ids := deviceIDs(n)
	// The fleet is loaded once, for every round of the checkpoint (a load
	// of the full profile's 10M records takes minutes), in thirds timed
	// apart, which gives the write rate a spread.
	r.p.Printf("checkpoint", "%d devices into the durable registry", n)
	var (
		load   time.Duration
		thirds []float64
	)
	for t := range 3 {
		lo, hi := t*n/3, (t+1)*n/3
		start := time.Now()
		if err := preloadDurable(ctx, reg, ids[lo:hi]); err != nil {
			return err
		}
		d := time.Since(start)
		load += d
		thirds = append(thirds, math.Round(float64(hi-lo)/d.Seconds()))
	}
	r.p.Printf("checkpoint", "loaded in %s (%.0f records/s; thirds %s)", load.Round(time.Millisecond), float64(n)/load.Seconds(),
		runs(thirds, "/s"))
	var lost []shard.Entry
	for j := 0; j < n; j += checkpointLost {
		lost = append(lost, shard.Entry{ID: ids[j]})
	}

	// Checkpoints of the loaded fleet and walks of it, alternated. Every
	// checkpoint finds new marks to copy (the same devices, lost at a new
	// deadline), so each does the work of the first; every walk checks
	// that the registry holds the marks of the last checkpoint.
	meter := r.newCPUMeter(ctx, nil)
	var (
		cps, walks       []time.Duration
		cpCPUs, walkCPUs []cpuShares
		copied           int64 // the deadline of the marks the last checkpoint copied
	)
	err = alternate(rounds, func(round int) error {
		dl := max(time.Now().UnixMilli(), copied+1)
		for j := range lost {
			lost[j].Deadline = dl
		}
		for lo := 0; lo < len(lost); lo += 1000 {
			_, errs := store.LostMarks().SwapMulti(ctx, lost[lo:min(lo+1000, len(lost))], time.Now().UnixMilli())
			for _, err := range errs {
				if err != nil {
					return err
				}
			}
		}
		d, cpu, err := r.checkpointOnce(ctx, store, topo, reg, pub, meter)
		if err != nil {
			return err
		}
		r.p.Printf("checkpoint", "round %d of %d: checkpoint %s (%s)", round+1, rounds, d.Round(time.Millisecond), cpu)
		cps, cpCPUs, copied = append(cps, d), append(cpCPUs, cpu), dl
		return nil
	}, func(round int) error {
		s0 := meter.sample()
		start := time.Now()
		walked, marked, current := 0, 0, 0
		if err := reg.Each(ctx, func(d dispatch.DeviceRecord) error {
			walked++
			if d.LostDeadline != 0 {
				marked++
			}
			if d.LostDeadline == copied {
				current++
			}
			return nil
		}); err != nil {
			return err
		}
		d, cpu := time.Since(start), meter.since(s0)
		want := len(lost)
		if copied == 0 {
			want = 0
		}
		switch {
		case walked != n:
			return fmt.Errorf("the walk read %d records, want %d", walked, n)
		case marked != want || copied != 0 && current != want:
			return fmt.Errorf("after %d checkpoints the registry holds %d lost marks, %d of the last checkpoint's, want %d",
				len(cps), marked, current, want)
		}
		r.p.Printf("checkpoint", "round %d of %d: walk %s (%s)", round+1, rounds, d.Round(time.Millisecond), cpu)
		walks, walkCPUs = append(walks, d), append(walkCPUs, cpu)
		return nil
	})
	if err != nil {
		return err
	}

	cj, wj := slices.Index(cps, slices.Min(cps)), slices.Index(walks, slices.Min(walks))
	f := newFigure(fmt.Sprintf("checkpoint, %s devices (%s lost)", size, groupThousands(int64(len(lost)))), "s",
		cps[cj].Seconds(), "registry walk alone", walks[wj].Seconds())
	f.Detail = fmt.Sprintf("best of %d each, the order alternated: checkpoint runs %s, walk runs %s; the best checkpoint: %s; "+
		"the best walk: %s", rounds, checkpointDurations(cps), checkpointDurations(walks), cpCPUs[cj], walkCPUs[wj])
	// What one checkpoint costs, spread over the interval between two.
	busy := func(s cpuShares) float64 { return s["sigwatch"] + s["nats-server"] + s["redis"] }
	avg := make([]float64, len(cps))
	for j := range cps {
		avg[j] = busy(cpCPUs[j]) * cps[j].Seconds() / guard.DefaultCheckpoint.Seconds()
	}
	fc := newFigure(fmt.Sprintf("checkpoint CPU, %s devices, averaged over its 5-minute interval", size), "% of a core",
		slices.Min(avg), "", 0)
	fc.Detail = fmt.Sprintf("the CPU of the process, nats-server and Redis during one checkpoint, spread over the interval between "+
		"two; the lowest of %d checkpoints, alternated with the walks: runs %s", rounds, checkpointShares(avg))
	fl := newFigure(fmt.Sprintf("durable registry records written/s, %s devices", size), "/s", float64(n)/load.Seconds(), "", 0)
	fl.Detail = fmt.Sprintf("dispatch.Registry.Add in batches of 1,000 from 4 goroutines, as ingest records devices it sees first; "+
		"one load of the fleet, not best of %d (the checkpoint's rounds reuse it), timed in thirds: %s", rounds, runs(thirds, "/s"))
	sc.Figures = append(sc.Figures, f, fc, fl)
	sc.Notes = append(sc.Notes, fmt.Sprintf("One device in %d is marked lost in Redis before each checkpoint, at a new deadline "+
		"each time, so every checkpoint copies as many marks into the registry; a walk that follows a checkpoint checks "+
		"that the registry holds its marks. %d checkpoints and %d walks of the one loaded fleet, alternated; each "+
		"checkpoint is the first of a guard of its own, one interval after it starts. The checkpoint runs in one process "+
		"of an installation every %s.", checkpointLost, rounds, rounds, guard.DefaultCheckpoint))
	r.res.add(sc)
	return nil
}

// checkpointOnce runs the guard of one process until its first checkpoint,
// one interval after it starts, and times that checkpoint. A guard of its
// own each time: the next checkpoint does not start before the caller has
// new marks in place.
func (r *runner) checkpointOnce(ctx context.Context, store *shard.Store, topo *shard.Watcher, reg *dispatch.Registry,
	pub *dispatch.Bus, meter *cpuMeter) (time.Duration, cpuShares, error) {
	const every = time.Second
	pr := prometheus.NewRegistry()
	g := guard.New(guard.Options{Store: store, Topo: topo, Registry: reg, Pub: pub,
		Thresholds: shard.NewThresholds(store, threshold, nil), Initial: shards, Checkpoint: every,
		Registerer: pr, Log: slog.New(slog.DiscardHandler)})
	if err := g.Establish(ctx); err != nil {
		return 0, nil, err
	}
	gctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Run(gctx)
	}()
	defer func() { stop(); <-done }()
	time.Sleep(every)
	s0 := meter.sample()
	start := time.Now()
	if !waitFor(ctx, 30*time.Minute, func() bool { return counterValue(pr, "sigwatch_registry_checkpoints_total") >= 1 }) {
		return 0, nil, fmt.Errorf("no checkpoint after 30 minutes")
	}
	return time.Since(start), meter.since(s0), nil
}

// checkpointDurations lists ds to the millisecond, for a figure's detail.
func checkpointDurations(ds []time.Duration) string {
	out := make([]string, len(ds))
	for j, d := range ds {
		out[j] = d.Round(time.Millisecond).String()
	}
	return strings.Join(out, ", ")
}

// checkpointShares lists shares of a core, which are small: to the
// hundredth.
func checkpointShares(vs []float64) string {
	out := make([]string, len(vs))
	for j, v := range vs {
		out[j] = fmt.Sprintf("%.2f", v)
	}
	return strings.Join(out, ", ") + " % of a core"
}
