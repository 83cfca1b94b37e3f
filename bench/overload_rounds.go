package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// overload is scenario 8: a fleet signalling over Mosquitto into ingest and
// a scanner in this process (ingest's own watermark, probes through the
// broker), at its nominal rate, then twice that for a while, then the
// nominal rate again; some devices stay silent and fall due all along, and
// their fire lag says how far behind the system is. The baseline is the
// same run at the nominal rate throughout. Each side runs rounds times, the
// order alternated; each figure keeps a side's best run.
func (r *runner) overload(ctx context.Context) error {
	n := r.prof.OverloadDevices
	rate := float64(n) / r.prof.OverloadEvery.Seconds()
	sc := Scenario{ID: 8, Name: "overload", Title: "Transient 2× overload",
		Baselines: []string{fmt.Sprintf("the same run at the nominal rate throughout (%s devices, one signal each per %s, "+
			"%.0f signals/s over Mosquitto at QoS 1), in the same run on the same machine.", groupThousands(int64(n)),
			r.prof.OverloadEvery, rate)}}
	var overs, bases []overloadRun
	err := alternate(rounds, func(round int) error {
		r.p.Printf("overload", "nominal run, round %d of %d", round+1, rounds)
		x, err := r.overloadSide(ctx, false)
		if err != nil {
			return fmt.Errorf("nominal load, round %d: %w", round+1, err)
		}
		bases = append(bases, x)
		return nil
	}, func(round int) error {
		r.p.Printf("overload", "surge run, round %d of %d", round+1, rounds)
		x, err := r.overloadSide(ctx, true)
		if err != nil {
			return fmt.Errorf("2× surge, round %d: %w", round+1, err)
		}
		overs = append(overs, x)
		return nil
	})
	if err != nil {
		return err
	}
	p50 := func(l lagStats) float64 { return l.P50 }
	p99 := func(l lagStats) float64 { return l.P99 }
	for k, ph := range overloadPhases {
		over, base := overs[overloadBestLag(overs, k)], bases[overloadBestLag(bases, k)]
		f := newFigure("fire lag p99, deadlines "+ph+" the surge", "ms", over.Lag[k].P99, "nominal load only", base.Lag[k].P99)
		f.Detail = fmt.Sprintf("%s, the run of the lowest p99 kept: surge runs %s, nominal runs %s; best surge run %s, "+
			"offered %.0f/s, stored %.0f/s; best nominal run %s, offered %.0f/s, stored %.0f/s", bestOf(rounds),
			overloadLags(overs, k, p99), overloadLags(bases, k, p99), over.Lag[k], over.Offered[k], over.Stored[k],
			base.Lag[k], base.Offered[k], base.Stored[k])
		p := newFigure("fire lag p50, deadlines "+ph+" the surge", "ms", over.Lag[k].P50, "nominal load only", base.Lag[k].P50)
		p.Detail = fmt.Sprintf("p50 of each side's run of the lowest p99 (%s): surge runs %s, nominal runs %s",
			bestOf(rounds), overloadLags(overs, k, p50), overloadLags(bases, k, p50))
		sc.Figures = append(sc.Figures, f, p)
	}
	bi := overloadBestDrain(overs)
	over := overs[bi]
	drain := newFigure(fmt.Sprintf("time to drain after the surge (watermark age < %s for 1 s)", drainedAge), "s",
		over.Drain.Seconds(), "", 0)
	maxAges := make([]string, len(bases))
	for j, b := range bases {
		maxAges[j] = b.MaxAge.Round(time.Millisecond).String()
	}
	stored := "its drain was too short to measure what was stored while draining"
	if over.DrainRate > 0 {
		stored = fmt.Sprintf("it stored %.0f signals/s while draining against %.0f/s offered", over.DrainRate, rate)
	}
	drain.Detail = fmt.Sprintf("best of %d surge runs (the shortest drain), alternated with the nominal runs: drains %s; in that run "+
		"the largest watermark age was %s (nominal runs: %s); %s", rounds, overloadDrains(overs),
		over.MaxAge.Round(time.Millisecond), strings.Join(maxAges, ", "), stored)
	if over.Drain < 0 {
		drain.Detail = "never drained while the load ran; " + drain.Detail
	}
	sc.Figures = append(sc.Figures, drain)
	// The drain rate is only measured by a run whose drain lasted long
	// enough to have one.
	var drainRates []float64
	for _, x := range overs {
		if x.DrainRate > 0 {
			drainRates = append(drainRates, math.Round(x.DrainRate))
		}
	}
	if len(drainRates) > 0 {
		dr := newFigure("ingest rate while draining", "/s", slices.Max(drainRates), "offered (nominal)", rate)
		dr.Detail = fmt.Sprintf("the highest of the %d of %d surge runs that drained for 500 ms or more: runs %s",
			len(drainRates), len(overs), runs(drainRates, "/s"))
		sc.Figures = append(sc.Figures, dr)
	}
	sc.Notes = append(sc.Notes, fmt.Sprintf("%s devices publish round-robin over 4 MQTT connections (a child process) at "+
		"%.0f signals/s; the surge run doubles that for %s after %s, then returns to it for %s. %d other devices never "+
		"signal and fall due evenly over the three phases; the scanner fires up to ingest's watermark (its probes "+
		"come back through the broker behind the backlog), so a device's fire lag is how far behind ingest was. "+
		"Ingest, the scanner and the publisher of lost events run in this process, as `sigwatch run` runs every role.",
		groupThousands(int64(n)), rate, r.prof.OverloadSurge, r.prof.OverloadBefore, r.prof.OverloadAfter, r.prof.OverloadVictims),
		fmt.Sprintf("Each side ran %d times, the order alternated (nominal first in the first round); every run starts from "+
			"an emptied Redis, a new ingest session (cleared on the broker when the run ends), a new load generator and a "+
			"new reader of the event stream.", rounds))
	for _, s := range []struct {
		name string
		xs   []overloadRun
	}{{"surge", overs}, {"nominal", bases}} {
		for j, x := range s.xs {
			if x.Lost > 0 || x.Early > 0 {
				sc.Notes = append(sc.Notes, fmt.Sprintf("%s run %d: %d acked signals never stored, %d lost events before their deadline.",
					s.name, j+1, x.Lost, x.Early))
			}
		}
	}
	sc.Notes = append(sc.Notes, fmt.Sprintf("While the load of surge run %d (the shortest drain) ran: %s.", bi+1, over.Shares))
	r.res.add(sc)
	return nil
}

// overloadBestLag is the index of the run of the lowest p99 lag in phase k;
// a run that saw no deadline in it counts as the worst.
func overloadBestLag(xs []overloadRun, k int) int {
	best := 0
	for j, x := range xs {
		b := xs[best].Lag[k]
		if x.Lag[k].N > 0 && (b.N == 0 || x.Lag[k].P99 < b.P99) {
			best = j
		}
	}
	return best
}

// overloadBestDrain is the index of the run that drained the soonest; one
// that never drained counts as the worst.
func overloadBestDrain(xs []overloadRun) int {
	best := 0
	for j, x := range xs {
		b := xs[best].Drain
		if x.Drain >= 0 && (b < 0 || x.Drain < b) {
			best = j
		}
	}
	return best
}

// overloadLags lists one measure of every run's lag in phase k.
func overloadLags(xs []overloadRun, k int, of func(lagStats) float64) string {
	vs := make([]float64, len(xs))
	for j, x := range xs {
		vs[j] = of(x.Lag[k])
	}
	return runs(vs, "ms")
}

// overloadDrains lists every run's drain time.
func overloadDrains(xs []overloadRun) string {
	out := make([]string, len(xs))
	for j, x := range xs {
		out[j] = "never"
		if x.Drain >= 0 {
			out[j] = x.Drain.Round(time.Millisecond).String()
		}
	}
	return strings.Join(out, ", ")
}
