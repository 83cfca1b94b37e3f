package bench

import (
	"context"
	"fmt"
	"math"
	"strconv"
)

// timersBatch is how many resets one NATS message carries on sigwatch's
// path.
const timersBatch = 500

// natsInFlight bounds the NATS-native timer's unacknowledged publishes.
const natsInFlight = 4096

// timers is scenario 9: sigwatch's generic timers against the NATS-native
// resettable timer (a stream with one message per subject, per-message TTL
// and subject delete markers: each reset is one publish with Nats-TTL, and
// the marker is the fire), side by side: resets/s, memory per timer, and
// fire lateness with 20k timers due spread over the lag window and 100k
// due at once.
func (r *runner) timers(ctx context.Context) error {
	sc := Scenario{ID: 9, Name: "timers", Title: "Generic timers vs the NATS-native timer",
		Baselines: []string{"NATS-native timer (nats-server " + r.versionOf("nats-server") + "): a memory-storage stream " +
			"with `MaxMsgsPerSubject=1`, `AllowMsgTTL` and `SubjectDeleteMarkerTTL`; a timer is a subject, a reset is " +
			"one JetStream publish with a `Nats-TTL` header (whole seconds, at least 1 s), acknowledged by the " +
			"server; the fire is the delete marker the server stores when the TTL runs out, read by a JetStream " +
			"ordered consumer. Lateness is the marker's arrival minus the reset's publish time plus its TTL."}}
	for _, n := range r.prof.TimerCounts {
		// Each run of either side starts from empty and loads its n timers
		// (the memory figure) before it measures resets and lateness, so
		// the rounds are whole runs, the order alternated.
		var nts, sws []timerRun
		err := alternate(rounds,
			func(round int) error {
				r.p.Printf("timers", "%d timers, round %d of %d: NATS-native", n, round+1, rounds)
				t, err := r.natsTimers(ctx, n)
				if err != nil {
					return fmt.Errorf("NATS-native, %d timers, round %d: %w", n, round+1, err)
				}
				nts = append(nts, t)
				return nil
			},
			func(round int) error {
				r.p.Printf("timers", "%d timers, round %d of %d: sigwatch", n, round+1, rounds)
				// Its deadlines copy those of the NATS-native side's latest
				// run, which goes first in the first round.
				t, err := r.sigwatchTimers(ctx, n, nts[len(nts)-1])
				if err != nil {
					return fmt.Errorf("sigwatch, %d timers, round %d: %w", n, round+1, err)
				}
				sws = append(sws, t)
				return nil
			})
		if err != nil {
			return err
		}
		figs, notes := r.timerFigures(n, sws, nts)
		sc.Figures = append(sc.Figures, figs...)
		sc.Notes = append(sc.Notes, notes...)
	}
	sc.Notes = append(sc.Notes, "sigwatch runs its timer service in the harness process (one replica owning all "+
		strconv.Itoa(shards)+" shards, firing through the same JetStream publisher as the lost events, storing NATS resets with "+
		"its consumer); lateness is the event's arrival through an ordered JetStream consumer of the event stream (so once "+
		"stored, as the NATS-native side's markers are read) minus its deadline. Each run of either side starts from "+
		"empty (the stream created; Redis flushed and the timer service started), loads its timers, then measures resets "+
		"and lateness; every figure is each side's best of "+strconv.Itoa(rounds)+" runs, the side that runs first "+
		"alternating from round to round. Between sigwatch's measurements the harness waits until the service has stored "+
		"what it had already pulled from the reset stream, or been asked, so that a rate counts only its own resets and "+
		"no late reset pushes back a deadline the lateness sets. The other timers of each count stay 10 minutes ahead, and both systems hold "+
		"the same count. The NATS-native timer's deadlines "+
		"have whole-second TTLs counted from each publish, so the spread ones fall due in one-second steps and the ones "+
		"\"due at once\" over the time their publishing took; sigwatch's deadlines are set the same distances apart "+
		"as in the NATS-native side's latest run (recorded as it publishes; it runs first in the first round).")
	r.res.add(sc)
	return nil
}

// timerRun is what one run of one system measured.
type timerRun struct {
	resets, single float64 // resets/s
	fastResets     float64 // resets/s in fast batches (the NATS-native timer)
	requested      float64 // resets/s, one per request answered once stored
	requestMissed  int64   // requests refused or unanswered within requestTimeout
	requestCPU     cpuShares
	// bytes is the live memory per timer: Redis's used_memory growth for
	// sigwatch, nats-server's live heap growth for the NATS-native timer.
	bytes float64
	// streamBytes and rssBytes are the NATS-native timer's stream bytes and
	// nats-server RSS growth per timer, for context.
	streamBytes, rssBytes float64
	spread, once          lagStats
	backlog               uint64
	cpu, onceCPU          cpuShares
	// spreadAt and onceAt are the NATS-native side's deadlines, in ms
	// after its first, for its timers in order: the sigwatch side sets its
	// deadlines the same distance apart.
	spreadAt, onceAt []int64
}

// bestTimerRun returns the run of rs whose measure is best, the highest with
// higher and else the lowest, and every run's measure in order.
func bestTimerRun(rs []timerRun, of func(timerRun) float64, higher bool) (timerRun, []float64) {
	vs := timerMeasures(rs, of)
	b := 0
	for j, v := range vs {
		if higher && v > vs[b] || !higher && v < vs[b] {
			b = j
		}
	}
	return rs[b], vs
}

// timerMeasures is every run's measure, in order.
func timerMeasures(rs []timerRun, of func(timerRun) float64) []float64 {
	vs := make([]float64, len(rs))
	for j, t := range rs {
		vs[j] = of(t)
	}
	return vs
}

// perSecond lists rates for a figure's detail, to the unit.
func perSecond(vs []float64) string {
	out := make([]float64, len(vs))
	for j, v := range vs {
		out[j] = math.Round(v)
	}
	return runs(out, "/s")
}

// timerFigures are the figures of n timers, each side's best run of sws
// (sigwatch) and nts (the NATS-native timer), and notes on them.
func (r *runner) timerFigures(n int, sws, nts []timerRun) (figs []Figure, notes []string) {
	size := groupThousands(int64(n))
	resets := func(t timerRun) float64 { return t.resets }

	// The NATS-native timer with its best publishing: asynchronous
	// publishes, or fast batches where they are faster.
	sw, swRuns := bestTimerRun(sws, resets, true)
	na, naRuns := bestTimerRun(nts, resets, true)
	fa, fastRuns := bestTimerRun(nts, func(t timerRun) float64 { return t.fastResets }, true)
	best, how := na.resets, "asynchronous publishes"
	if fa.fastResets > best {
		best, how = fa.fastResets, "fast batches"
	}
	f := newFigure(fmt.Sprintf("timer resets/s, %s timers", size), "/s", sw.resets, "NATS-native timer, best publishing", best, ratioAtLeast(3))
	f.Detail = fmt.Sprintf("%s. sigwatch: resets published over NATS (`sigwatch.timers.set.<queue>`), %d per message, "+
		"stored in Redis and then acknowledged, counted as stored: %s; its best run left a backlog of %d messages, %s. "+
		"NATS-native (its best publishing: %s): one acknowledged publish per reset, %d in flight, %s (best run %s); "+
		"fast batches of %d (nats-server 2.14+, one acknowledgement per 100 and one per batch), %s",
		bestOf(rounds), timersBatch, perSecond(swRuns), sw.backlog, sw.cpu, how, natsInFlight, perSecond(naRuns), na.cpu,
		atomicBatch, perSecond(fastRuns))

	// One reset per message on both sides: the NATS-native timer's
	// acknowledged publish per reset.
	one, oneRuns := bestTimerRun(sws, func(t timerRun) float64 { return t.single }, true)
	single := newFigure(fmt.Sprintf("timer resets/s, one reset per NATS message (diagnostic), %s timers", size), "/s",
		one.single, "NATS-native timer, one publish per reset", na.resets)
	single.Detail = fmt.Sprintf("%s. The same path with a message per reset (its ceiling is the JetStream publish rate the "+
		"NATS-native timer has, plus sigwatch's store): sigwatch %s; NATS-native, one acknowledged publish per reset, %s",
		bestOf(rounds), perSecond(oneRuns), perSecond(naRuns))

	rq, rqRuns := bestTimerRun(sws, func(t timerRun) float64 { return t.requested }, true)
	req := newFigure(fmt.Sprintf("timer resets/s, one reset per request answered once stored, %s timers", size), "/s",
		rq.requested, "NATS-native timer, one publish per reset", na.resets, ratioAtLeast(1))
	req.Detail = fmt.Sprintf("%s. sigwatch: one core NATS request per reset on `sigwatch.timers.reset.<queue>`, answered once "+
		"the reset is stored in Redis, %d requests in flight (as many as the NATS-native timer's publishes): %s, best run %s; "+
		"NATS-native, one acknowledged publish per reset: %s; requests refused or unanswered within %v, over every run: %d",
		bestOf(rounds), natsInFlight, perSecond(rqRuns), rq.requestCPU, perSecond(naRuns), requestTimeout,
		sumOf(sws, func(t timerRun) int64 { return t.requestMissed }))

	perTimer := func(t timerRun) float64 { return t.bytes }
	swm, swmRuns := bestTimerRun(sws, perTimer, false)
	ntm, ntmRuns := bestTimerRun(nts, perTimer, false)
	streamRuns := timerMeasures(nts, func(t timerRun) float64 { return t.streamBytes })
	rssRuns := timerMeasures(nts, func(t timerRun) float64 { return t.rssBytes })
	mem := newFigure(fmt.Sprintf("memory per timer, %s timers", size), "B", swm.bytes, "NATS-native timer", ntm.bytes, ratioAtMost(0.5))
	mem.Detail = fmt.Sprintf("live bytes on both sides; %s, the lowest kept. sigwatch: Redis used_memory growth / timers "+
		"(its allocator's count of the bytes it holds), a timer without payload (member `<queue>/<id>`): %s. "+
		"NATS-native: nats-server's live heap growth / timers (Go's HeapAlloc after a forced GC in the process that "+
		"embeds the server: everything it holds for the timers, messages, subject index and TTL tracking): %s. For "+
		"context, the stream's own accounting (its messages only) was %s per timer and nats-server's RSS grew by %s "+
		"per timer (GC headroom, and pages returned to the system or not yet, make it noisy). No disk on either side: the stream has "+
		"memory storage and Redis runs without persistence (no RDB, no AOF)",
		bestOf(rounds), runs(swmRuns, "B"), runs(ntmRuns, "B"), runs(streamRuns, "B"), runs(rssRuns, "B"))
	figs = append(figs, f, single, req, mem)

	spread := fmt.Sprintf("%s due over %s", groupThousands(int64(r.prof.LagFires)), r.prof.LagWindow)
	once := fmt.Sprintf("%s due at once", groupThousands(int64(r.prof.Burst)))
	for _, l := range []struct {
		what   string
		of     func(timerRun) lagStats
		target Target
		cpu    bool
	}{{spread, func(t timerRun) lagStats { return t.spread }, ratioAtMost(0.1), false},
		{once, func(t timerRun) lagStats { return t.once }, ratioAtMost(0.8), true}} {
		p99 := func(t timerRun) float64 { return l.of(t).P99 }
		p50 := func(t timerRun) float64 { return l.of(t).P50 }
		sw, swP99 := bestTimerRun(sws, p99, false)
		nt, ntP99 := bestTimerRun(nts, p99, false)
		swP50, ntP50 := timerMeasures(sws, p50), timerMeasures(nts, p50)
		f99 := newFigure(fmt.Sprintf("timer lateness p99, %s timers, %s", size, l.what), "ms", l.of(sw).P99, "NATS-native timer", l.of(nt).P99, l.target)
		f99.Detail = fmt.Sprintf("%s, the lowest p99 kept: sigwatch %s, NATS-native %s; p99 of each run: sigwatch %s; NATS-native %s",
			bestOf(rounds), l.of(sw), l.of(nt), runs(swP99, "ms"), runs(ntP99, "ms"))
		if l.cpu {
			f99.Detail += fmt.Sprintf(" (from arming them to the last fire, in those runs: sigwatch %s; NATS-native %s)", sw.onceCPU, nt.onceCPU)
		}
		f50 := newFigure(fmt.Sprintf("timer lateness p50, %s timers, %s", size, l.what), "ms", l.of(sw).P50, "NATS-native timer", l.of(nt).P50)
		f50.Detail = fmt.Sprintf("%s: from each side's run of the lowest p99; p50 of each run: sigwatch %s; NATS-native %s",
			bestOf(rounds), runs(swP50, "ms"), runs(ntP50, "ms"))
		figs = append(figs, f99, f50)
		early, k := 0.0, 0
		for _, t := range sws {
			if m := l.of(t).Min; m < 0 {
				early, k = min(early, m), k+1
			}
		}
		if k > 0 {
			notes = append(notes, fmt.Sprintf("%s timers, %s: in %d of %d runs some timer events arrived before their "+
				"deadline (earliest %.1f ms early): no early fire is broken at this commit.", size, l.what, k, len(sws), -early))
		}
	}
	return figs, notes
}

// sumOf adds one count over the runs.
func sumOf(rs []timerRun, of func(timerRun) int64) int64 {
	var n int64
	for _, x := range rs {
		n += of(x)
	}
	return n
}
