package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/periodic"
	"github.com/sigwatch/sigwatch/shard"
)

// naivePoll is the period of the naive design's poller, as the seed had
// it; naiveFastPoll the period a user who wants a low lag would give it.
const (
	naivePoll     = time.Second
	naiveFastPoll = 20 * time.Millisecond
)

// fireLag is scenario 3: fire lag (event received on NATS minus deadline)
// with 100k (and, in the full profile, 1M) watched devices while resets run
// at about half of the raw write ceiling, against the naive design: one
// ZSET and a poller every second doing ZRANGEBYSCORE + ZREM, on the same
// data and the same reset load.
func (r *runner) fireLag(ctx context.Context) error {
	sc := Scenario{ID: 3, Name: "firelag", Title: "Fire lag under resets",
		Baselines: []string{"naive design (the seed's): every device in one ZSET, resets written as variadic `ZADD GT` " +
			"batches at the same rate as sigwatch's, and one poller that every second reads everything due " +
			"(`ZRANGEBYSCORE -inf now WITHSCORES`), removes it (`ZREM`) and publishes the same lost events through the " +
			"same JetStream publisher; lag is measured the same way on both sides, by an ordered JetStream consumer of the " +
			"event stream (so after the stream stored the event). A second naive poller runs every 20 ms, as a user who " +
			"wants a low lag would set it."}}
	rate := r.ceiling / 2
	if rate <= 0 {
		rate = 100_000
		sc.Notes = append(sc.Notes, "The write ceiling was not measured in this run; resets ran at 100,000/s.")
	}
	w, err := newLostWatcher(ctx, r.e.ni.URL, "sigwatch.lost.>")
	if err != nil {
		return err
	}
	defer w.close()
	for _, n := range r.prof.LagDevices {
		sw, swResets, err := r.lagRun(ctx, w, n, rate, 0)
		if err != nil {
			return fmt.Errorf("sigwatch, %d devices: %w", n, err)
		}
		nv, nvResets, err := r.lagRun(ctx, w, n, rate, naivePoll)
		if err != nil {
			return fmt.Errorf("naive, %d devices: %w", n, err)
		}
		fast, _, err := r.lagRun(ctx, w, n, rate, naiveFastPoll)
		if err != nil {
			return fmt.Errorf("naive at %v, %d devices: %w", naiveFastPoll, n, err)
		}
		size := groupThousands(int64(n))
		p99 := []Target{ratioAtMost(0.05)}
		if n >= 1_000_000 {
			p99 = append(p99, valueAtMost(50))
		}
		f := newFigure(fmt.Sprintf("fire lag p99, %s devices", size), "ms", sw.P99, "naive poller", nv.P99, p99...)
		f.Detail = fmt.Sprintf("sigwatch %s, %d resets/s achieved (target %.0f), %s; naive %s, %d resets/s, %s",
			sw, swResets, rate, sw.CPU, nv, nvResets, nv.CPU)
		sc.Figures = append(sc.Figures, f,
			newFigure(fmt.Sprintf("fire lag p50, %s devices", size), "ms", sw.P50, "naive poller", nv.P50),
			newFigure(fmt.Sprintf("fire lag max, %s devices", size), "ms", sw.Max, "naive poller", nv.Max))
		if swResets > 0 && nvResets > 0 {
			// Redis's share of a core over the window, per reset written.
			perReset := func(st lagStats, resets int) float64 { return st.CPU["redis"] / 100 / float64(resets) * 1e6 }
			fr := newFigure(fmt.Sprintf("Redis CPU per reset, %s devices", size), "µs", perReset(sw, swResets),
				"naive poller", perReset(nv, nvResets))
			fr.Detail = "Redis's CPU while the devices fell due, divided by the resets written meanwhile (the scanner's and the poller's own work included)"
			sc.Figures = append(sc.Figures, fr)
		}
		ff := newFigure(fmt.Sprintf("fire lag p99 vs a naive poller at %v, %s devices", naiveFastPoll, size), "ms", sw.P99,
			fmt.Sprintf("naive poller at %v", naiveFastPoll), fast.P99, ratioAtMost(0.5))
		ff.Detail = fmt.Sprintf("the same naive design polling every %v; naive %s, %s", naiveFastPoll, fast, fast.CPU)
		sc.Figures = append(sc.Figures, ff)
		if n == r.prof.LagDevices[0] {
			// The same run with no resets separates the scanner's own lag
			// from what the reset load adds.
			idle, _, err := r.lagRun(ctx, w, n, 0, 0)
			if err != nil {
				return fmt.Errorf("sigwatch without resets, %d devices: %w", n, err)
			}
			f := newFigure(fmt.Sprintf("fire lag p99, %s devices, no resets (diagnostic)", size), "ms", idle.P99, "", 0)
			f.Detail = "sigwatch " + idle.String() + ", " + idle.CPU.String()
			sc.Figures = append(sc.Figures, f)
		}
		if sw.Min < 0 {
			sc.Notes = append(sc.Notes, fmt.Sprintf("%s devices: some lost events arrived before their deadline "+
				"(earliest %.1f ms early): DESIGN.md invariant 1 (no early fire) is broken at this commit.", size, -sw.Min))
		}
	}
	sc.Notes = append(sc.Notes, fmt.Sprintf("%d devices fall due, spread evenly over %s, and are never reset; every other "+
		"device is reset (its deadline pushed 10 minutes ahead) by 4 writers in batches of %d, paced to half the raw "+
		"write ceiling of scenario 2. The scanner (on a Redis client of its own, as `sigwatch run` wires it) fires up to "+
		"an ingest watermark that a stand-in advances every %s, as ingest's probe does by default.",
		r.prof.LagFires, r.prof.LagWindow, writeBatch, ingest.DefaultProbeInterval))
	r.res.add(sc)
	return nil
}

// lagRun runs one side of the fire-lag scenario with n devices and returns
// the lag statistics and the resets/s achieved.
func (r *runner) lagRun(ctx context.Context, w *lostWatcher, n int, rate float64, poll time.Duration) (lagStats, int, error) {
	side, naive := "sigwatch", poll > 0
	if naive {
		side = "naive at " + poll.String()
	}
	what := fmt.Sprintf("firelag %s, %s devices", side, groupThousands(int64(n)))
	if err := r.e.flush(ctx); err != nil {
		return lagStats{}, 0, err
	}
	ids := deviceIDs(n)
	m := min(r.prof.LagFires, n/2)
	victims, alive := ids[:m], ids[m:]
	far := time.Now().Add(10 * time.Minute).UnixMilli()
	keys := shard.NewKeys("sw")
	store := shard.NewStore(r.e.rc, keys)
	const naiveKey = "naive:dl"
	rc := r.e.rc

	r.p.Printf("firelag", "%s: loading", what)
	var write writeFunc
	var stop func()
	if naive {
		if err := parallelChunks(ctx, n, 1000, 4, func(lo, hi int) error {
			c := rc.B().Zadd().Key(naiveKey).ScoreMember()
			for j := lo; j < hi; j++ {
				c = c.ScoreMember(float64(far), ids[j])
			}
			return rc.Do(ctx, c.Build()).Error()
		}); err != nil {
			return lagStats{}, 0, err
		}
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
		if err := preload(ctx, store, ids, func(int) int64 { return far }); err != nil {
			return lagStats{}, 0, err
		}
		if err := preloadFleet(ctx, store, ids); err != nil {
			return lagStats{}, 0, err
		}
		g, err := r.startScanRig(ctx)
		if err != nil {
			return lagStats{}, 0, err
		}
		if write, err = r.sigwatchWriter(ctx, store); err != nil {
			g.stop()
			return lagStats{}, 0, err
		}
		stop = g.stop
	}

	load := &writeLoad{ids: alive, writers: writeWriters, batch: writeBatch, rate: rate, ahead: 10 * time.Minute, write: write}
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
		err = parallelChunks(ctx, m, 1000, 4, func(lo, hi int) error {
			c := rc.B().Zadd().Key(naiveKey).ScoreMember()
			for j := lo; j < hi; j++ {
				c = c.ScoreMember(float64(deadline(j)), victims[j])
			}
			return rc.Do(ctx, c.Build()).Error()
		})
	} else {
		err = setDeadlines(ctx, rc, keys, victims, deadline)
	}
	if err != nil {
		return lagStats{}, 0, err
	}
	if rate == 0 {
		what += ", no resets"
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

// naivePoller is the naive design's expiry loop: every period it reads
// everything due from the one ZSET, removes it and publishes a lost event
// for each.
func naivePoller(ctx context.Context, rc rueidis.Client, pub *dispatch.Publisher, key string, period time.Duration) {
	periodic.Run(ctx, period, func(now time.Time) {
		due, err := rc.Do(ctx, rc.B().Zrangebyscore().Key(key).Min("-inf").
			Max(fmt.Sprint(now.UnixMilli())).Withscores().Build()).AsZScores()
		if err != nil || len(due) == 0 {
			return
		}
		ids := make([]string, len(due))
		msgs := make([]dispatch.Message, len(due))
		firedAt := time.Now().UnixMilli()
		for j, z := range due {
			ids[j] = z.Member
			dl := int64(z.Score)
			ev := dispatch.Lost{ID: dispatch.LostID(z.Member, dl), Device: z.Member, Type: "default",
				Deadline: dl, LastSeen: dl - threshold.Milliseconds(), FiredAt: firedAt}
			msgs[j], _ = dispatch.Encode(pub.Subjects().Lost(""), ev.ID, ev)
		}
		if err := rc.Do(ctx, rc.B().Zrem().Key(key).Member(ids...).Build()).Error(); err != nil {
			return
		}
		pub.Publish(ctx, msgs)
	})
}
