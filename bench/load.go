package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// shards is the shard count of every scenario: sigwatch's default.
const shards = 16

// deviceID is the id of device i, the same in the harness and in the load
// generator: 11 characters, close to the 12-character ids real fleets use.
func deviceID(i int) string {
	s := strconv.Itoa(i)
	const width = 7
	if len(s) < width {
		s = "0000000"[:width-len(s)] + s
	}
	return "dev-" + s
}

func deviceIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = deviceID(i)
	}
	return ids
}

// groupByShard groups entries by shard, as ingest's flush does.
func groupByShard(es []shard.Entry) map[int][]shard.Entry {
	by := make(map[int][]shard.Entry, shards)
	for _, e := range es {
		i := shard.Of(e.ID, shards)
		by[i] = append(by[i], e)
	}
	return by
}

// preload writes deadline(j) for every id through store.Upsert, in batches
// of 1,000 from 8 goroutines.
func preload(ctx context.Context, store *shard.Store, ids []string, deadline func(j int) int64) error {
	return parallelChunks(ctx, len(ids), 1000, 8, func(lo, hi int) error {
		es := make([]shard.Entry, 0, hi-lo)
		for j := lo; j < hi; j++ {
			es = append(es, shard.Entry{ID: ids[j], Deadline: deadline(j)})
		}
		_, err := store.Upsert(ctx, shard.Deadlines, groupByShard(es))
		return err
	})
}

// preloadRegistry records every id in the registry with type typ, as
// ingest does when a device is first seen.
func preloadRegistry(ctx context.Context, store *shard.Store, ids []string, typ string) error {
	now := time.Now().UnixMilli()
	return parallelChunks(ctx, len(ids), 1000, 4, func(lo, hi int) error {
		ss := make([]shard.Sighting, 0, hi-lo)
		for _, id := range ids[lo:hi] {
			ss = append(ss, shard.Sighting{ID: id, Type: typ})
		}
		for _, d := range store.SeenMulti(ctx, ss, now) {
			if d.Err != nil {
				return d.Err
			}
		}
		return nil
	})
}

// preloadFleet records every id in the registry as a production fleet
// looks: every other device has a type, and the devices sit behind
// gateways of 50 (their group).
func preloadFleet(ctx context.Context, store *shard.Store, ids []string) error {
	now := time.Now().UnixMilli()
	return parallelChunks(ctx, len(ids), 1000, 4, func(lo, hi int) error {
		ss := make([]shard.Sighting, 0, hi-lo)
		for j := lo; j < hi; j++ {
			s := shard.Sighting{ID: ids[j], Group: fmt.Sprintf("gw-%05d", j/fleetGateway)}
			if j%2 == 0 {
				s.Type = "sensor"
			}
			ss = append(ss, s)
		}
		for _, d := range store.SeenMulti(ctx, ss, now) {
			if d.Err != nil {
				return d.Err
			}
		}
		return nil
	})
}

// fleetGateway is how many devices of a preloaded fleet share a gateway.
const fleetGateway = 50

// preloadDurable records ids in the durable registry as ingest does when
// it first sees them.
func preloadDurable(ctx context.Context, reg *dispatch.Registry, ids []string) error {
	return parallelChunks(ctx, len(ids), 1000, 4, func(lo, hi int) error {
		recs := make([]dispatch.DeviceRecord, 0, hi-lo)
		for _, id := range ids[lo:hi] {
			recs = append(recs, dispatch.DeviceRecord{ID: id})
		}
		for _, err := range reg.Add(ctx, recs, func(*dispatch.DeviceRecord, bool) (bool, bool) { return false, false }) {
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// setDeadlines sets deadline(j) for ids[j] unconditionally (ZADD without
// GT): the harness moves deadlines earlier to make devices fall due.
func setDeadlines(ctx context.Context, rc rueidis.Client, keys shard.Keys, ids []string, deadline func(j int) int64) error {
	// Through the store's Set, which wakes a shard's sleeping loop as every
	// write that moves a deadline earlier does in sigwatch.
	store := shard.NewStore(rc, keys)
	return parallelChunks(ctx, len(ids), 1000, 4, func(lo, hi int) error {
		es := make([]shard.Entry, 0, hi-lo)
		for j := lo; j < hi; j++ {
			es = append(es, shard.Entry{ID: ids[j], Deadline: deadline(j)})
		}
		for i, es := range groupByShard(es) {
			if err := store.Set(ctx, shard.Deadlines, i, es...); err != nil {
				return err
			}
		}
		return nil
	})
}

func firstErr(rs []rueidis.RedisResult) error {
	for _, r := range rs {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

// parallelChunks calls f on [lo, hi) chunks of [0, n) from workers
// goroutines and returns the first error.
func parallelChunks(ctx context.Context, n, chunk, workers int, f func(lo, hi int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				lo := int(next.Add(int64(chunk))) - chunk
				if lo >= n {
					return
				}
				if err := f(lo, min(lo+chunk, n)); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// writeLoad is a closed-loop or paced writer of deadline resets: writers
// goroutines each build batches of batch signals for random ids of the key
// space and hand them to write. With rate > 0 the writers together are paced
// to rate signals/s; otherwise they go as fast as write returns.
type writeLoad struct {
	ids     []string
	writers int
	batch   int
	rate    float64
	// ahead is how far in the future a reset pushes a deadline.
	ahead time.Duration
	write writeFunc

	done   atomic.Int64 // signals written
	errors atomic.Int64
}

// run writes until ctx is done.
func (w *writeLoad) run(ctx context.Context) {
	var wg sync.WaitGroup
	start := time.Now()
	for k := range w.writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k)+1, uint64(start.UnixNano())))
			var sent float64
			for ctx.Err() == nil {
				if w.rate > 0 {
					// Each writer owns rate/writers; it sleeps until its
					// next batch is due.
					sent += float64(w.batch)
					due := start.Add(time.Duration(sent / (w.rate / float64(w.writers)) * float64(time.Second)))
					if d := time.Until(due); d > 0 {
						select {
						case <-time.After(d):
						case <-ctx.Done():
							return
						}
					}
				}
				dl := time.Now().Add(w.ahead).UnixMilli()
				es := make([]shard.Entry, w.batch) // a writer may keep the batch
				for j := range es {
					es[j] = shard.Entry{ID: w.ids[rng.IntN(len(w.ids))], Deadline: dl}
				}
				if err := w.write(ctx, es); err != nil {
					if ctx.Err() == nil {
						w.errors.Add(1)
					}
					continue
				}
				w.done.Add(int64(len(es)))
			}
		})
	}
	wg.Wait()
}

// writeFunc writes one batch of deadline resets; it may keep es.
type writeFunc func(ctx context.Context, es []shard.Entry) error

// sigwatchWriter returns ingest's deadline writer: a shard.Writer, which
// places a batch by shard under the topology in force and pushes the
// deadlines forward with one fenced script call per shard, all shards in
// one round trip.
func (r *runner) sigwatchWriter(ctx context.Context, store *shard.Store) (writeFunc, error) {
	topo, err := shard.NewWatcher(ctx, store, shards, 500*time.Millisecond, nil)
	if err != nil {
		return nil, err
	}
	w := shard.NewWriter(store, fmt.Sprintf("bench-writer-%d", time.Now().UnixNano()), topo.Current, topo.Refresh)
	return func(ctx context.Context, es []shard.Entry) error {
		_, err := w.Upsert(ctx, shard.Deadlines, es, nil)
		return err
	}, nil
}

// rawZaddWriter is the raw ceiling: the batch grouped by shard, one
// variadic ZADD GT per shard, all shards in one DoMulti.
func rawZaddWriter(rc rueidis.Client, key func(i int) string) writeFunc {
	return func(ctx context.Context, es []shard.Entry) error {
		by := groupByShard(es)
		cmds := make(rueidis.Commands, 0, len(by))
		for i, es := range by {
			c := rc.B().Zadd().Key(key(i)).Gt().ScoreMember()
			for _, e := range es {
				c = c.ScoreMember(float64(e.Deadline), e.ID)
			}
			cmds = append(cmds, c.Build())
		}
		return firstErr(rc.DoMulti(ctx, cmds...))
	}
}

// measured is a throughput measurement with the CPU it cost.
type measured struct {
	Rate        float64 // operations/s
	ClientCPUus float64 // this process's CPU µs per operation
	RedisCPUus  float64 // Redis's CPU µs per operation
	Ops         int64
	Errors      int64
}

// measureWrites runs w for d and reports its rate and CPU per signal.
func (r *runner) measureWrites(ctx context.Context, w *writeLoad, d time.Duration) measured {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	cpu0, rcpu0, t0 := processCPU(), r.e.redisCPU(ctx), time.Now()
	w.run(ctx)
	el := time.Since(t0)
	cpu, rcpu := processCPU()-cpu0, r.e.redisCPU(context.Background())-rcpu0
	return newMeasured(w.done.Load(), w.errors.Load(), el, cpu, rcpu)
}

// newMeasured is ops operations, and errs failed ones, done in el at a cost
// of cpu of this process and serverCPU of the server measured. Rate and
// costs per operation stay zero when no operation was done.
func newMeasured(ops, errs int64, el, cpu, serverCPU time.Duration) measured {
	m := measured{Ops: ops, Errors: errs}
	if ops > 0 {
		m.Rate = float64(ops) / el.Seconds()
		m.ClientCPUus = float64(cpu.Microseconds()) / float64(ops)
		m.RedisCPUus = float64(serverCPU.Microseconds()) / float64(ops)
	}
	return m
}

// percentile returns the p-th percentile (0..100) of sorted xs.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	k := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(k, len(sorted)-1))]
}

// lagStats summarises fire lags in ms.
type lagStats struct {
	N             int
	P50, P99, Max float64
	Min           float64
	CPU           cpuShares // who was busy while the devices fell due
}

func summarize(lags []float64) lagStats {
	s := slices.Clone(lags)
	slices.Sort(s)
	if len(s) == 0 {
		return lagStats{}
	}
	return lagStats{N: len(s), P50: percentile(s, 50), P99: percentile(s, 99), Max: s[len(s)-1], Min: s[0]}
}

func (l lagStats) String() string {
	return fmt.Sprintf("n=%d min=%.0f p50=%.0f p99=%.0f max=%.0f ms", l.N, l.Min, l.P50, l.P99, l.Max)
}
