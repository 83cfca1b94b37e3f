package bench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/periodic"
)

// naivePoll is the period of the naive design's poller, as the seed had
// it; naiveFastPoll the period a user who wants a low lag would give it.
const (
	naivePoll     = time.Second
	naiveFastPoll = 20 * time.Millisecond
)

// fireLag is scenario 3: fire lag (event received on NATS minus deadline)
// with 100k (and, in the full profile, 1M and 10M) watched devices while
// resets run at about half of the raw write ceiling, against the naive
// design: one ZSET and a poller every second doing ZRANGEBYSCORE + ZREM, on
// the same data and the same reset load. Each fleet size is loaded once and
// every side runs rounds times on it, the order alternated.
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
		f, err := r.loadLagFleet(ctx, n)
		if err != nil {
			return fmt.Errorf("%d devices: %w", n, err)
		}
		side := func(out *[]lagResult, what string, rate float64, poll time.Duration) func(int) error {
			return func(round int) error {
				st, resets, err := r.lagRun(ctx, w, f, round, rate, poll)
				if err != nil {
					return fmt.Errorf("%s, %d devices, round %d: %w", what, n, round+1, err)
				}
				*out = append(*out, lagResult{st: st, resets: resets})
				return nil
			}
		}
		var sws, nvs, fasts, idles []lagResult
		sides := []func(int) error{side(&sws, "sigwatch", rate, 0), side(&nvs, "naive", rate, naivePoll),
			side(&fasts, fmt.Sprintf("naive at %v", naiveFastPoll), rate, naiveFastPoll)}
		first := n == r.prof.LagDevices[0]
		if first {
			// The same runs with no resets separate the scanner's own lag
			// from what the reset load adds.
			sides = append(sides, side(&idles, "sigwatch without resets", 0, 0))
		}
		if err := alternate(rounds, sides...); err != nil {
			return err
		}
		sw, nv, fast := bestLag(sws), bestLag(nvs), bestLag(fasts)
		size := groupThousands(int64(n))
		spread := lagSpread(sws, nvs, "naive")
		p99 := []Target{ratioAtMost(0.05)}
		if n >= 1_000_000 {
			p99 = append(p99, valueAtMost(50))
		}
		f99 := newFigure(fmt.Sprintf("fire lag p99, %s devices", size), "ms", sw.st.P99, "naive poller", nv.st.P99, p99...)
		f99.Detail = fmt.Sprintf("%s; sigwatch %s, %d resets/s achieved (target %.0f), %s; naive %s, %d resets/s, %s",
			spread, sw.st, sw.resets, rate, sw.st.CPU, nv.st, nv.resets, nv.st.CPU)
		f50 := newFigure(fmt.Sprintf("fire lag p50, %s devices", size), "ms", sw.st.P50, "naive poller", nv.st.P50)
		f50.Detail = fmt.Sprintf("%s; p50 of every run: sigwatch %s; naive %s", spread,
			runs(lagOf(sws, lagP50), "ms"), runs(lagOf(nvs, lagP50), "ms"))
		fmax := newFigure(fmt.Sprintf("fire lag max, %s devices", size), "ms", sw.st.Max, "naive poller", nv.st.Max)
		fmax.Detail = fmt.Sprintf("%s; max of every run: sigwatch %s; naive %s", spread,
			runs(lagOf(sws, lagMax), "ms"), runs(lagOf(nvs, lagMax), "ms"))
		sc.Figures = append(sc.Figures, f99, f50, fmax)
		if sw.resets > 0 && nv.resets > 0 {
			fr := newFigure(fmt.Sprintf("Redis CPU per reset, %s devices", size), "µs", sw.perReset(), "naive poller", nv.perReset())
			fr.Detail = fmt.Sprintf("Redis's CPU while the devices fell due, divided by the resets written meanwhile "+
				"(the scanner's and the poller's own work included); %s; every run: sigwatch %s; naive %s", spread,
				runs(lagOf(sws, lagResult.perReset), "µs"), runs(lagOf(nvs, lagResult.perReset), "µs"))
			sc.Figures = append(sc.Figures, fr)
		}
		ff := newFigure(fmt.Sprintf("fire lag p99 vs a naive poller at %v, %s devices", naiveFastPoll, size), "ms", sw.st.P99,
			fmt.Sprintf("naive poller at %v", naiveFastPoll), fast.st.P99, ratioAtMost(0.5))
		ff.Detail = fmt.Sprintf("the same naive design polling every %v; %s; naive %s, %s", naiveFastPoll,
			lagSpread(sws, fasts, fmt.Sprintf("naive at %v", naiveFastPoll)), fast.st, fast.st.CPU)
		sc.Figures = append(sc.Figures, ff)
		if first {
			idle := bestLag(idles)
			fi := newFigure(fmt.Sprintf("fire lag p99, %s devices, no resets (diagnostic)", size), "ms", idle.st.P99, "", 0)
			fi.Detail = fmt.Sprintf("%s with the other sides, the run with the lowest p99 (p99 of every run: %s); sigwatch %s, %s",
				bestOf(rounds), runs(lagOf(idles, lagP99), "ms"), idle.st, idle.st.CPU)
			sc.Figures = append(sc.Figures, fi)
		}
		if early := slices.Min(lagOf(append(slices.Clone(sws), idles...), lagMin)); early < 0 {
			sc.Notes = append(sc.Notes, fmt.Sprintf("%s devices: some lost events arrived before their deadline "+
				"(earliest %.1f ms early): guarantee 1 of docs/guarantees.md (no early fire) is broken at this commit.", size, -early))
		}
		if f.pushed > 0 {
			sc.Notes = append(sc.Notes, fmt.Sprintf("%s devices: the runs outlasted the 10 minutes the load put the "+
				"deadlines ahead; between runs, those of the devices the resets cover were pushed 10 minutes ahead again "+
				"(%d times).", size, f.pushed))
		}
	}
	sc.Notes = append(sc.Notes, fmt.Sprintf("Each fleet size is loaded once: sigwatch's shards and registry and the naive "+
		"ZSET hold the same devices side by side, and each run starts only its own side (the scanner and sigwatch's "+
		"writer, or a naive poller and raw writes to the ZSET, which both pollers share). Every side runs %d times, the "+
		"order rotated from round to round, and each figure keeps each side's run with the lowest p99: its p50, max and "+
		"Redis CPU come from that run.", rounds),
		fmt.Sprintf("Each round has its own %d devices, which fall due spread evenly over %s and are never reset; after "+
			"a run they are put back as loaded (seen again, which clears sigwatch's lost marks, and their deadline a day "+
			"ahead) for the round's next side. Every device that is no round's victim is reset (its deadline pushed "+
			"10 minutes ahead) by %d writers in batches of %d, paced to half the raw write ceiling of scenario 2. The "+
			"scanner (on a Redis client of its own, as `sigwatch run` wires it) fires up to an ingest watermark that a "+
			"stand-in advances every %s, as ingest's probe does by default; each of sigwatch's runs starts with no "+
			"watermark, so the time the other sides ran is no ingest outage.",
			r.prof.LagFires, r.prof.LagWindow, writeWriters, writeBatch, ingest.DefaultProbeInterval))
	r.res.add(sc)
	return nil
}

// lagResult is one run of one side: its lags and the resets/s achieved.
type lagResult struct {
	st     lagStats
	resets int
}

// perReset is Redis's CPU over the run per reset written, in µs.
func (l lagResult) perReset() float64 {
	if l.resets <= 0 {
		return 0
	}
	return l.st.CPU["redis"] / 100 / float64(l.resets) * 1e6
}

// bestLag is the run with the lowest p99.
func bestLag(rs []lagResult) lagResult {
	return slices.MinFunc(rs, func(a, b lagResult) int { return cmp.Compare(a.st.P99, b.st.P99) })
}

func lagP99(l lagResult) float64 { return l.st.P99 }
func lagP50(l lagResult) float64 { return l.st.P50 }
func lagMax(l lagResult) float64 { return l.st.Max }
func lagMin(l lagResult) float64 { return l.st.Min }

// lagOf is f of every run.
func lagOf(rs []lagResult, f func(lagResult) float64) []float64 {
	out := make([]float64, len(rs))
	for j, l := range rs {
		out[j] = f(l)
	}
	return out
}

// lagSpread says how a comparison's runs were chosen and gives every run's
// p99 on both sides.
func lagSpread(sw, base []lagResult, baseName string) string {
	return fmt.Sprintf("%s, each side's run with the lowest p99 (p99 of every run: sigwatch %s; %s %s)",
		bestOf(rounds), runs(lagOf(sw, lagP99), "ms"), baseName, runs(lagOf(base, lagP99), "ms"))
}

// naivePoller is the naive design's expiry loop: every period it reads
// everything due from the one ZSET, removes it and publishes a lost event
// for each.
func naivePoller(ctx context.Context, rc rueidis.Client, pub *dispatch.Bus, key string, period time.Duration) {
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
			msgs[j], _ = dispatch.Encode(pub.Subjects(), ev)
		}
		if err := rc.Do(ctx, rc.B().Zrem().Key(key).Member(ids...).Build()).Error(); err != nil {
			return
		}
		pub.Publish(ctx, msgs)
	})
}
