package bench

import (
	"context"
	"fmt"
	"log/slog"
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
	r.p.Printf("checkpoint", "%d devices into the durable registry", n)
	start := time.Now()
	if err := preloadDurable(ctx, reg, ids); err != nil {
		return err
	}
	load := time.Since(start)
	r.p.Printf("checkpoint", "loaded in %s (%.0f records/s)", load.Round(time.Millisecond), float64(n)/load.Seconds())
	var lost []shard.Entry
	for j := 0; j < n; j += checkpointLost {
		lost = append(lost, shard.Entry{ID: ids[j], Deadline: time.Now().UnixMilli()})
	}
	for lo := 0; lo < len(lost); lo += 1000 {
		for _, err := range store.MarkLostMulti(ctx, lost[lo:min(lo+1000, len(lost))], time.Now().UnixMilli()) {
			if err != nil {
				return err
			}
		}
	}

	// The walk alone.
	meter := r.newCPUMeter(ctx, nil)
	s0 := meter.sample()
	start = time.Now()
	walked := 0
	if err := reg.Each(ctx, func(dispatch.DeviceRecord) error { walked++; return nil }); err != nil {
		return err
	}
	walk, walkCPU := time.Since(start), meter.since(s0)
	if walked != n {
		return fmt.Errorf("the walk read %d records, want %d", walked, n)
	}

	// The checkpoint, as a process runs it: the first one a checkpoint
	// interval after the guard starts.
	const every = time.Second
	pr := prometheus.NewRegistry()
	g := guard.New(guard.Options{Store: store, Topo: topo, Registry: reg, Pub: pub,
		Thresholds: shard.NewThresholds(store, threshold, nil), Initial: shards, Checkpoint: every,
		Registerer: pr, Log: slog.New(slog.DiscardHandler)})
	if err := g.Establish(ctx); err != nil {
		return err
	}
	gctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Run(gctx)
	}()
	defer func() { stop(); <-done }()
	time.Sleep(every)
	s0 = meter.sample()
	start = time.Now()
	if !waitFor(ctx, 30*time.Minute, func() bool { return counterValue(pr, "sigwatch_registry_checkpoints_total") >= 1 }) {
		return fmt.Errorf("no checkpoint after 30 minutes")
	}
	cp, cpCPU := time.Since(start), meter.since(s0)
	stop()
	<-done
	var marked int
	if err := reg.Each(ctx, func(d dispatch.DeviceRecord) error {
		if d.LostDeadline != 0 {
			marked++
		}
		return nil
	}); err != nil {
		return err
	}
	if marked != len(lost) {
		return fmt.Errorf("after the checkpoint the registry holds %d lost marks, want %d", marked, len(lost))
	}
	r.p.Printf("checkpoint", "walk %s, checkpoint %s (%s)", walk.Round(time.Millisecond), cp.Round(time.Millisecond), cpCPU)

	f := newFigure(fmt.Sprintf("checkpoint, %s devices (%s lost)", size, groupThousands(int64(len(lost)))), "s",
		cp.Seconds(), "registry walk alone", walk.Seconds())
	f.Detail = fmt.Sprintf("checkpoint: %s; walk: %s", cpCPU, walkCPU)
	busy := func(s cpuShares) float64 { return s["sigwatch"] + s["nats-server"] + s["redis"] }
	fc := newFigure(fmt.Sprintf("checkpoint CPU, %s devices, averaged over its 5-minute interval", size), "% of a core",
		busy(cpCPU)*cp.Seconds()/guard.DefaultCheckpoint.Seconds(), "", 0)
	fc.Detail = "the CPU of the process, nats-server and Redis during one checkpoint, spread over the interval between two"
	fl := newFigure(fmt.Sprintf("durable registry records written/s, %s devices", size), "/s", float64(n)/load.Seconds(), "", 0)
	fl.Detail = "dispatch.Registry.Add in batches of 1,000 from 4 goroutines, as ingest records devices it sees first"
	sc.Figures = append(sc.Figures, f, fc, fl)
	sc.Notes = append(sc.Notes, fmt.Sprintf("One device in %d is marked lost in Redis before the checkpoint; it copies those "+
		"marks into the registry (checked afterwards). The checkpoint runs in one process of an installation every %s.",
		checkpointLost, guard.DefaultCheckpoint))
	r.res.add(sc)
	return nil
}
