package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// naiveKey is the naive design's one ZSET.
const naiveKey = "naive:dl"

// parked is how far ahead a victim's deadline waits for its round.
const parked = 24 * time.Hour

// lagFleet is one fleet size of the fire-lag scenario, loaded once for every
// side and round: sigwatch's shards and registry and the naive design's
// ZSET hold the same devices side by side, and each run starts only its own
// side's machinery. The first rounds×m ids are the victims, m per round,
// parked and never reset; the reset load covers the others (alive).
type lagFleet struct {
	n, m  int
	ids   []string
	alive []string
	// due is when the alive devices no reset reached yet fall due (unix
	// ms): resets push deadlines 10 minutes ahead, so a load 10 minutes
	// ahead leaves every reset a push forward, as it is in production.
	due   int64
	keys  shard.Keys
	store *shard.Store
	write writeFunc // sigwatch's deadline writer
	// pushed counts the times the alive deadlines were pushed ahead again
	// because the runs outlasted them.
	pushed int
}

func (f *lagFleet) victims(round int) []string { return f.ids[round*f.m : (round+1)*f.m] }

// loadLagFleet empties Redis and loads n devices for both designs.
func (r *runner) loadLagFleet(ctx context.Context, n int) (*lagFleet, error) {
	if err := r.e.flush(ctx); err != nil {
		return nil, err
	}
	ids := deviceIDs(n)
	// A quarter of the fleet at least is left to the resets.
	m := min(r.prof.LagFires, n/(rounds+1))
	f := &lagFleet{n: n, m: m, ids: ids, alive: ids[rounds*m:], keys: shard.NewKeys("sw")}
	f.store = shard.NewStore(r.e.rc, f.keys)
	what := fmt.Sprintf("firelag, %s devices", groupThousands(int64(n)))
	r.p.Printf("firelag", "%s: loading sigwatch's shards and registry and the naive ZSET", what)
	start := time.Now()
	f.due = start.Add(10 * time.Minute).UnixMilli()
	park := start.Add(parked).UnixMilli()
	deadline := func(j int) int64 {
		if j < rounds*m {
			return park
		}
		return f.due
	}
	if err := preload(ctx, f.store, ids, deadline); err != nil {
		return nil, err
	}
	if err := preloadFleet(ctx, f.store, ids); err != nil {
		return nil, err
	}
	if err := r.naiveSet(ctx, ids, deadline); err != nil {
		return nil, err
	}
	var err error
	if f.write, err = r.sigwatchWriter(ctx, f.store); err != nil {
		return nil, err
	}
	r.p.Printf("firelag", "%s: loaded in %s", what, time.Since(start).Round(100*time.Millisecond))
	return f, nil
}

// naiveSet sets deadline(j) for ids[j] in the naive ZSET (plain ZADD).
func (r *runner) naiveSet(ctx context.Context, ids []string, deadline func(j int) int64) error {
	rc := r.e.rc
	return parallelChunks(ctx, len(ids), 1000, 4, func(lo, hi int) error {
		c := rc.B().Zadd().Key(naiveKey).ScoreMember()
		for j := lo; j < hi; j++ {
			c = c.ScoreMember(float64(deadline(j)), ids[j])
		}
		return rc.Do(ctx, c.Build()).Error()
	})
}

// lagRun runs one side of the fire-lag scenario for one round on the
// loaded fleet f: sigwatch (poll 0) or the naive poller every poll, with
// resets at rate (0: none). It returns the lag statistics and the resets/s
// achieved, and puts the round's victims back as loaded for the round's
// next side.
func (r *runner) lagRun(ctx context.Context, w *lostWatcher, f *lagFleet, round int, rate float64, poll time.Duration) (lagStats, int, error) {
	if err := r.keepAhead(ctx, f); err != nil {
		return lagStats{}, 0, err
	}
	st, resets, err := r.lagMeasure(ctx, w, f, round, rate, poll)
	if err != nil {
		return st, resets, err
	}
	return st, resets, r.revive(ctx, f, round, poll > 0)
}

// keepAhead pushes the alive devices' deadlines 10 minutes ahead again, on
// both sides, when a run might outlast them: only victims may fall due,
// and resets must still push every deadline forward.
func (r *runner) keepAhead(ctx context.Context, f *lagFleet) error {
	if time.Until(time.UnixMilli(f.due)) > r.prof.LagWindow+time.Minute {
		return nil
	}
	start := time.Now()
	f.due = start.Add(10 * time.Minute).UnixMilli()
	ahead := func(int) int64 { return f.due }
	if err := preload(ctx, f.store, f.alive, ahead); err != nil {
		return err
	}
	if err := r.naiveSet(ctx, f.alive, ahead); err != nil {
		return err
	}
	f.pushed++
	r.p.Printf("firelag", "%s devices: deadlines pushed ahead again in %s", groupThousands(int64(f.n)),
		time.Since(start).Round(100*time.Millisecond))
	return nil
}

// revive puts a round's victims back as loaded on the side that just ran:
// seen again (which clears sigwatch's lost marks, type and group kept) and
// parked.
func (r *runner) revive(ctx context.Context, f *lagFleet, round int, naive bool) error {
	v := f.victims(round)
	park := time.Now().Add(parked).UnixMilli()
	if naive {
		return r.naiveSet(ctx, v, func(int) int64 { return park })
	}
	now := time.Now().UnixMilli()
	if err := parallelChunks(ctx, len(v), 1000, 4, func(lo, hi int) error {
		ss := make([]shard.Sighting, 0, hi-lo)
		for _, id := range v[lo:hi] {
			ss = append(ss, shard.Sighting{ID: id})
		}
		for _, d := range f.store.SeenMulti(ctx, ss, now) {
			if d.Err != nil {
				return d.Err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	return preload(ctx, f.store, v, func(int) int64 { return park })
}

// lagMeasure is one run: it starts the side's machinery, runs the reset
// load, makes the round's victims fall due over the window and measures
// their lag from the event stream.
func (r *runner) lagMeasure(ctx context.Context, w *lostWatcher, f *lagFleet, round int, rate float64, poll time.Duration) (lagStats, int, error) {
	side, naive := "sigwatch", poll > 0
	if naive {
		side = "naive at " + poll.String()
	}
	what := fmt.Sprintf("firelag %s, %s devices, round %d", side, groupThousands(int64(f.n)), round+1)
	if rate == 0 {
		what += ", no resets"
	}
	victims, m := f.victims(round), f.m
	rc := r.e.rc

	var write writeFunc
	var stop func()
	if naive {
		pub, err := dispatch.New(ctx, r.e.nc, dispatch.Options{})
		if err != nil {
			return lagStats{}, 0, err
		}
		write = rawZaddWriter(rc, func(int) string { return naiveKey })
		pctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { naivePoller(pctx, rc, pub, naiveKey, poll) })
		stop = func() { cancel(); wg.Wait() }
	} else {
		// Each run starts with no watermark, as after a flush: the time
		// the other sides ran is no ingest outage.
		if err := rc.Do(ctx, rc.B().Del().Key(f.keys.Watermark(), f.keys.Outages()).Build()).Error(); err != nil {
			return lagStats{}, 0, err
		}
		g, err := r.startScanRig(ctx)
		if err != nil {
			return lagStats{}, 0, err
		}
		write, stop = f.write, g.stop
	}

	load := &writeLoad{ids: f.alive, writers: writeWriters, batch: writeBatch, rate: rate, ahead: 10 * time.Minute, write: write}
	lctx, stopLoad := context.WithCancel(ctx)
	var lwg sync.WaitGroup
	loadStart := time.Now()
	if rate > 0 {
		lwg.Go(func() { load.run(lctx) })
	}
	defer func() { stopLoad(); lwg.Wait(); stop() }()

	// Let the reset load settle, then make the victims fall due, evenly
	// spread over the window.
	time.Sleep(time.Second)
	w.reset()
	t0 := time.Now().Add(time.Second).UnixMilli()
	step := float64(r.prof.LagWindow.Milliseconds()) / float64(m)
	deadline := func(j int) int64 { return t0 + int64(float64(j)*step) }
	var err error
	if naive {
		err = r.naiveSet(ctx, victims, deadline)
	} else {
		err = setDeadlines(ctx, rc, f.keys, victims, deadline)
	}
	if err != nil {
		return lagStats{}, 0, err
	}
	r.p.Printf("firelag", "%s: %d devices fall due over %s while resets run at %.0f/s", what, m, r.prof.LagWindow, rate)
	meter := r.newCPUMeter(ctx, nil)
	s0 := meter.sample()
	end := time.UnixMilli(t0).Add(r.prof.LagWindow)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for w.count() < m && time.Now().Before(end.Add(5*time.Second)) && ctx.Err() == nil {
		select {
		case <-tick.C:
			r.p.Printf("firelag", "%s: %d/%d lost events received, %d resets", what, w.count(), m, load.done.Load())
		case <-ctx.Done():
		}
	}
	shares := meter.since(s0)
	stopLoad()
	lwg.Wait()
	resets := int(float64(load.done.Load()) / time.Since(loadStart).Seconds())
	if rate == 0 {
		resets = 0
	}
	st, dups := w.stats()
	if st.N < m {
		return st, resets, fmt.Errorf("%d of %d lost events received", st.N, m)
	}
	if load.errors.Load() > 0 {
		r.p.Printf("firelag", "%s: %d reset batches failed", what, load.errors.Load())
	}
	st.CPU = shares
	r.p.Printf("firelag", "%s: lag %s; %d duplicates; %d resets/s; %s", what, st, dups, resets, shares)
	return st, resets, nil
}
