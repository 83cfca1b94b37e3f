// Package doubling measures what a shard doubling costs the write path:
// the deadline-write throughput of ingest-like writers before, during and
// after a doubling, on a live Redis, with a timer engine (shard/queue) draining the old shards.
// The bench harness calls Measure; its test runs it small.
//
// The writers do what ingest does per flush: place a batch by the topology
// they know (shard.Writer), write it, and record in the registry the
// devices that were absent from their shard (ingest's first-seen path).
// During a drain every moved device is absent from its new shard once, so
// that registry write is most of the dip.
//
// Goroutines: Measure owns every goroutine it starts (writers, their epoch
// reporter, the topology watcher, the watermark and the engine) and stops
// them before it returns, writers first.
package doubling

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
)

// Options size a measurement.
type Options struct {
	// Store is the Redis to measure on; its topology is created with
	// Shards if absent, and doubled once.
	Store *shard.Store
	// Devices is the key space, default 100_000; all are written once
	// before measuring.
	Devices int
	// Writers is the number of concurrent writers, default 4; Batch the
	// signals per write, default 500.
	Writers int
	Batch   int
	// Threshold is how far ahead a write pushes a deadline, default 5s. A
	// drain lasts about a threshold, since a moved device's old copy leaves
	// when it falls due.
	Threshold time.Duration
	// Phase is the length of the before and after measurements, default 3s.
	Phase time.Duration
	// Shards is the shard count to start from, default 16.
	Shards int
	// MaxDrain bounds the wait for the drain, default 10 thresholds.
	MaxDrain time.Duration
}

// defaults fills the zero fields with the defaults given above; a negative
// number, like zero, selects the default (max(v, 0) makes it zero for
// cmp.Or).
func (o *Options) defaults() {
	o.Devices = cmp.Or(max(o.Devices, 0), 100_000)
	o.Writers = cmp.Or(max(o.Writers, 0), 4)
	o.Batch = cmp.Or(max(o.Batch, 0), 500)
	o.Threshold = cmp.Or(max(o.Threshold, 0), 5*time.Second)
	o.Phase = cmp.Or(max(o.Phase, 0), 3*time.Second)
	o.Shards = cmp.Or(max(o.Shards, 0), 16)
	o.MaxDrain = cmp.Or(max(o.MaxDrain, 0), 10*o.Threshold)
}

// Result is one measurement. Rates are signals written per second.
type Result struct {
	From, To int
	Before   float64
	During   float64 // from the doubling's start until its drain ended
	After    float64
	// Dip is During/Before and Recovery After/Before: the figures to report.
	Dip      float64
	Recovery float64
	Drain    time.Duration
	// FirstSeen counts the registry writes of devices absent from their
	// shard, during the drain (about half the devices written in it).
	FirstSeen int64
	// Fired counts timers that fell due: none should, every device keeps
	// signalling; a non-zero value means the measurement was too slow.
	Fired int64
}

func (r Result) String() string {
	return fmt.Sprintf("doubling %d -> %d: %.0f/s before, %.0f/s during (x%.2f, drained in %v, %d first-seen writes), %.0f/s after (x%.2f)",
		r.From, r.To, r.Before, r.During, r.Dip, r.Drain.Round(100*time.Millisecond), r.FirstSeen, r.After, r.Recovery)
}

// Measure writes at full speed, doubles the topology once, and reports the
// write throughput before, during and after the doubling.
func Measure(ctx context.Context, opts Options) (Result, error) {
	opts.defaults()
	if opts.Store == nil {
		return Result{}, errors.New("doubling: Options.Store is required")
	}
	store := opts.Store
	topo, err := shard.NewWatcher(ctx, store, opts.Shards, 500*time.Millisecond, nil)
	if err != nil {
		return Result{}, fmt.Errorf("doubling: %w", err)
	}
	if t := topo.Current(); t.Draining() {
		return Result{}, fmt.Errorf("doubling: a doubling from %d to %d is already draining", t.Prev, t.Shards)
	}
	ids := make([]string, opts.Devices)
	for j := range ids {
		ids[j] = "bench-dbl-" + strconv.Itoa(j)
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }() // after the writers' own stop below
	wg.Go(func() { topo.Run(runCtx) })
	wg.Go(func() { advanceWatermark(runCtx, store) })

	var fired atomic.Int64
	eng, err := queue.New(queue.Options{
		Replica:    "doubling-bench-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		Family:     shard.Deadlines,
		DrainCheck: 500 * time.Millisecond,
	}, store, topo, counter{&fired}, nil, nil)
	if err != nil {
		return Result{}, fmt.Errorf("doubling: %w", err)
	}
	wg.Go(func() { _ = eng.Run(runCtx) })

	w := shard.NewWriter(store, "doubling-bench", topo.Current, topo.Refresh)
	wg.Go(func() { w.Run(runCtx, nil, nil) })
	// Every device is written once first, so first-seen writes before the
	// doubling do not count against the baseline.
	for lo := 0; lo < len(ids); lo += opts.Batch {
		es := make([]shard.Entry, 0, opts.Batch)
		dl := time.Now().Add(opts.Threshold).UnixMilli()
		for _, id := range ids[lo:min(lo+opts.Batch, len(ids))] {
			es = append(es, shard.Entry{ID: id, Deadline: dl})
		}
		if _, err := w.Upsert(ctx, shard.Deadlines, es, nil); err != nil {
			return Result{}, fmt.Errorf("doubling: preload: %w", err)
		}
	}

	var written, seen atomic.Int64
	errc := make(chan error, opts.Writers)
	writeCtx, stopWriters := context.WithCancel(runCtx)
	var writers sync.WaitGroup
	for k := range opts.Writers {
		writers.Go(func() {
			if err := write(writeCtx, store, w, ids, opts, uint64(k), &written, &seen); err != nil {
				errc <- err
			}
		})
	}
	defer func() { stopWriters(); writers.Wait() }()

	rate := func(d time.Duration) (float64, error) {
		n0, t0 := written.Load(), time.Now()
		select {
		case <-time.After(d):
		case err := <-errc:
			return 0, err
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return float64(written.Load()-n0) / time.Since(t0).Seconds(), nil
	}
	var res Result
	// Half a phase of warm-up, then the baseline.
	if _, err := rate(opts.Phase / 2); err != nil {
		return Result{}, err
	}
	if res.Before, err = rate(opts.Phase); err != nil {
		return Result{}, err
	}

	n0, s0, t0 := written.Load(), seen.Load(), time.Now()
	t, err := store.Double(ctx, t0)
	if err != nil {
		return Result{}, fmt.Errorf("doubling: %w", err)
	}
	res.From, res.To = t.Prev, t.Shards
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case err := <-errc:
			return Result{}, err
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
		cur, err := store.Topology(ctx)
		if err != nil {
			return Result{}, fmt.Errorf("doubling: %w", err)
		}
		if !cur.Draining() {
			break
		}
		if time.Since(t0) > opts.MaxDrain {
			return Result{}, fmt.Errorf("doubling: the drain did not finish within %v", opts.MaxDrain)
		}
	}
	res.Drain = time.Since(t0)
	res.During = float64(written.Load()-n0) / res.Drain.Seconds()
	res.FirstSeen = seen.Load() - s0
	if res.After, err = rate(opts.Phase); err != nil {
		return Result{}, err
	}
	if res.Before > 0 {
		res.Dip, res.Recovery = res.During/res.Before, res.After/res.Before
	}
	res.Fired = fired.Load()
	return res, nil
}

// write is one ingest-like writer: random batches of devices pushed a
// threshold ahead, and a registry write for each device absent from its
// shard, until ctx is done.
func write(ctx context.Context, store *shard.Store, w *shard.Writer, ids []string, opts Options, seed uint64, written, seen *atomic.Int64) error {
	rng := rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano())))
	es := make([]shard.Entry, opts.Batch)
	for ctx.Err() == nil {
		now := time.Now()
		dl := now.Add(opts.Threshold).UnixMilli()
		for j := range es {
			es[j] = shard.Entry{ID: ids[rng.IntN(len(ids))], Deadline: dl}
		}
		added, err := w.Upsert(ctx, shard.Deadlines, es, nil)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("doubling: write: %w", err)
		}
		if len(added) > 0 {
			ss := make([]shard.Sighting, len(added))
			for j, id := range added {
				ss[j].ID = id
			}
			for _, d := range store.SeenMulti(ctx, ss, now.UnixMilli()) {
				if d.Err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("doubling: record device: %w", d.Err)
				}
			}
		}
		written.Add(int64(len(es)))
		seen.Add(int64(len(added)))
	}
	return nil
}

// advanceWatermark plays ingest's watermark, so the engine claims.
func advanceWatermark(ctx context.Context, store *shard.Store) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		_, _ = store.Watermarks().Advance(ctx, time.Now().UnixMilli(), time.Hour)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// counter is the engine's handler in the measurement: it counts what fires
// and removes it.
type counter struct{ fired *atomic.Int64 }

func (c counter) Fire(_ context.Context, b queue.Batch) ([]shard.Entry, []shard.Move, error) {
	c.fired.Add(int64(len(b.Due)))
	return b.Due, nil, nil
}

func (counter) Fired(_ context.Context, ids []string) ([]int64, error) {
	return make([]int64, len(ids)), nil
}

func (counter) Revived(context.Context, shard.Entry, shard.Entry) error { return nil }
