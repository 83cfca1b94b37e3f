package stats

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"
)

// fleetReports is the sum of the fresh reports.
type fleetReports struct {
	signalsPerSec, lostPerSec float64
	minute                    Counts
	lag                       Lag
	alarms                    *AlarmCounts
	procs                     []Process
	brokerDown                []string // processes whose broker connection is down
}

// readReports reads and sums the fresh reports at now.
func (s *Fleet) readReports(ctx context.Context, now time.Time) (fleetReports, error) {
	rs, err := s.reports.Fresh(ctx, now, ReportMaxAge)
	if err != nil {
		return fleetReports{}, err
	}
	f := fleetReports{procs: []Process{}}
	lag := map[float64]uint64{}
	for name, r := range rs {
		var b procReport
		if json.Unmarshal([]byte(r.Body), &b) != nil {
			continue
		}
		f.procs = append(f.procs, Process{Name: name, Roles: b.Roles, AgeMS: now.UnixMilli() - r.At})
		if b.BrokerDown {
			f.brokerDown = append(f.brokerDown, name)
		}
		f.minute = f.minute.plus(b.Minute)
		if b.RecentSpanMS > 0 {
			f.signalsPerSec += float64(b.Recent.Signals) * 1000 / float64(b.RecentSpanMS)
			f.lostPerSec += float64(b.Recent.Lost) * 1000 / float64(b.RecentSpanMS)
		}
		for le, c := range b.FireLag {
			var v float64
			if _, err := fmt.Sscan(le, &v); err == nil {
				lag[v] += c
			}
		}
		// Only the owner of repeat shard 0 counts; the others say 0, and
		// for a moment around a lease move two may count: the largest is
		// the count.
		if a := b.Alarms; a != nil {
			if f.alarms == nil {
				f.alarms = &AlarmCounts{}
			}
			f.alarms.Active = max(f.alarms.Active, a.Active)
			f.alarms.Acked = max(f.alarms.Acked, a.Acked)
			f.alarms.Flapping = max(f.alarms.Flapping, a.Flapping)
			f.alarms.Held = max(f.alarms.Held, a.Held)
		}
	}
	sort.Slice(f.procs, func(i, j int) bool { return f.procs[i].Name < f.procs[j].Name })
	slices.Sort(f.brokerDown)
	f.lag = quantiles(lag)
	return f, nil
}

// quantiles reads p50 and p99 from lag, the sum of every scanner's
// cumulative bucket counts: summing buckets merges histograms exactly, so
// these are the quantiles of the whole fleet's lost events (interpolated
// within a bucket as Prometheus's histogram_quantile does), not an average
// of each scanner's.
func quantiles(lag map[float64]uint64) Lag {
	les := make([]float64, 0, len(lag))
	for le := range lag {
		les = append(les, le)
	}
	slices.Sort(les)
	if len(les) == 0 || lag[les[len(les)-1]] == 0 {
		return Lag{}
	}
	total := lag[les[len(les)-1]]
	q := func(q float64) *float64 {
		rank := q * float64(total)
		lo, below := 0.0, uint64(0)
		for _, le := range les {
			c := lag[le]
			if float64(c) >= rank {
				if math.IsInf(le, 1) {
					// Above the last finite bucket: its bound is all we know.
					le = lo
				} else if c > below {
					le = lo + (le-lo)*(rank-float64(below))/float64(c-below)
				}
				v := math.Round(le*1e4) / 10 // ms, to 0.1
				return &v
			}
			lo, below = le, c
		}
		return nil
	}
	return Lag{P50: q(0.5), P99: q(0.99), Count: int64(total)}
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }
