package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/periodic"
	"github.com/sigwatch/sigwatch/scanner"
	"github.com/sigwatch/sigwatch/shard"
)

// threshold is the silence threshold of every device in the harness:
// sigwatch's default.
const threshold = 30 * time.Second

// scanRig is sigwatch's expiry side running in this process: the topology
// watcher, a scanner owning every shard on a Redis client of its own (as
// `sigwatch run` gives the scanner role) checking the generation on every
// claim as in production, and a stand-in for ingest's
// watermark, which it advances every ingest.DefaultProbeInterval as
// ingest's probe would while ingest is consuming (the resets of these
// scenarios are written straight to Redis, not through a broker).
type scanRig struct {
	store *shard.Store
	pub   *dispatch.Bus
	reg   *dispatch.Registry
	sc    *scanner.Scanner
	rc    rueidis.Client // the scanner's own client

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startScanRig starts the rig and returns once the scanner owns every shard.
func (r *runner) startScanRig(ctx context.Context) (*scanRig, error) {
	return r.startScanner(ctx, true)
}

// startScanner starts the rig, with the watermark stand-in only if standIn
// is set (without it, ingest running alongside keeps the watermark), and
// returns once the scanner owns every shard.
func (r *runner) startScanner(ctx context.Context, standIn bool) (*scanRig, error) {
	store := shard.NewStore(r.e.rc, shard.NewKeys("sw"))
	topo, err := shard.NewWatcher(ctx, store, shards, 500*time.Millisecond, nil)
	if err != nil {
		return nil, err
	}
	thr := shard.NewThresholds(store, threshold, nil)
	pub, err := dispatch.New(ctx, r.natsConn(), dispatch.Options{Replicas: r.replicas()})
	if err != nil {
		return nil, err
	}
	rc, err := newRedisClient(r.e.redis.Addr)
	if err != nil {
		return nil, err
	}
	// The durable registry, as `sigwatch run` has it.
	reg, err := pub.OpenRegistry(ctx)
	if err != nil {
		rc.Close()
		return nil, err
	}
	// The generation, as `sigwatch run` establishes it for a new
	// installation: every claim checks it.
	gen := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	if gen, err = store.CreateGeneration(ctx, gen, time.Now().UnixMilli()); err != nil {
		rc.Close()
		return nil, err
	}
	if err := store.Vet(ctx, shards, gen); err != nil {
		rc.Close()
		return nil, err
	}
	store.SetGeneration(gen)
	scanStore := shard.NewStore(rc, shard.NewKeys("sw"))
	scanStore.ShareGeneration(store)
	sc, err := scanner.New(scanner.Options{Replica: fmt.Sprintf("bench-%d", time.Now().UnixNano()), Thresholds: thr},
		scanStore, topo, pub, prometheus.NewRegistry(), nil)
	if err != nil {
		rc.Close()
		return nil, err
	}
	if standIn {
		if _, err := store.Watermarks().Advance(ctx, time.Now().UnixMilli(), 3*time.Second); err != nil {
			rc.Close()
			return nil, err
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	g := &scanRig{store: store, pub: pub, reg: reg, sc: sc, rc: rc, cancel: cancel}
	g.wg.Go(func() { topo.Run(rctx) })
	g.wg.Go(func() { reg.Run(rctx) })
	if standIn {
		g.wg.Go(func() {
			periodic.Run(rctx, ingest.DefaultProbeInterval, func(now time.Time) {
				store.Watermarks().Advance(rctx, now.UnixMilli(), 3*time.Second)
			})
		})
	}
	g.wg.Go(func() { sc.Run(rctx) })
	if !waitFor(ctx, 15*time.Second, func() bool { return len(sc.Owned()) == shards }) {
		g.stop()
		return nil, fmt.Errorf("scanner owns %d of %d shards after 15s", len(sc.Owned()), shards)
	}
	return g, nil
}

// stop stops the scanner (which finishes its in-flight batches) and the
// watermark stand-in, waits for them, then closes the scanner's client.
func (g *scanRig) stop() {
	g.cancel()
	g.wg.Wait()
	g.rc.Close()
}

// lostWatcher reads lost events from the event stream as they are stored
// (an ordered JetStream consumer from the newest on) and records each
// event's fire lag: the time it was received, so after the stream stored
// it, minus its deadline. Every side publishes into the same stream.
type lostWatcher struct {
	nc *nats.Conn
	cc jetstream.ConsumeContext

	mu   sync.Mutex
	lags []float64          // ms
	byID map[string]float64 // lag of each event id, ms
	dups int
}

func newLostWatcher(ctx context.Context, url, subject string) (*lostWatcher, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, fmt.Errorf("bench: connect nats: %w", err)
	}
	w := &lostWatcher{nc: nc, byID: make(map[string]float64)}
	// The stream as sigwatch makes it, if no scenario did yet.
	if _, err := dispatch.New(ctx, nc, dispatch.Options{}); err != nil {
		nc.Close()
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	cons, err := js.OrderedConsumer(ctx, "SIGWATCH", jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverNewPolicy})
	if err == nil {
		w.cc, err = cons.Consume(func(m jetstream.Msg) { w.onData(m.Data()) })
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bench: read the event stream: %w", err)
	}
	return w, nil
}

func (w *lostWatcher) onData(data []byte) {
	now := time.Now()
	var ev struct {
		ID       string `json:"id"`
		Deadline int64  `json:"deadline"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		return
	}
	lag := float64(now.UnixMicro())/1000 - float64(ev.Deadline)
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.byID[ev.ID]; ok {
		w.dups++
		return
	}
	w.byID[ev.ID] = lag
	w.lags = append(w.lags, lag)
}

// reset forgets what was received so far.
func (w *lostWatcher) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lags, w.byID, w.dups = nil, make(map[string]float64), 0
}

func (w *lostWatcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.lags)
}

func (w *lostWatcher) stats() (lagStats, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return summarize(w.lags), w.dups
}

func (w *lostWatcher) close() {
	w.cc.Stop()
	w.nc.Close()
}

// cpuProfile records a CPU profile of this process into dir/name.pprof
// until the returned function is called, which adds the profile and its
// top costs to the results.
func (r *runner) cpuProfile(name, what string) (stop func()) {
	// A scenario measured more than once is profiled the first time.
	if slices.ContainsFunc(r.res.Profiles, func(p CPUProfile) bool { return p.Name == name }) {
		return func() {}
	}
	if err := os.MkdirAll(r.profDir, 0o755); err != nil {
		r.p.Printf("profile", "no CPU profile: %v", err)
		return func() {}
	}
	// Each profile of the run keeps its own files, as RESULTS.md shows both.
	path := filepath.Join(r.profDir, r.prof.Name+"-"+name+".pprof")
	f, err := os.Create(path)
	if err != nil {
		r.p.Printf("profile", "no CPU profile: %v", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		r.p.Printf("profile", "no CPU profile: %v", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		// The top costs are read at the end of the run, so that running
		// pprof does not disturb a measurement.
		r.res.Profiles = append(r.res.Profiles, CPUProfile{Name: name, What: what, File: filepath.ToSlash(path)})
		r.p.Printf("profile", "wrote %s", path)
	}
}
