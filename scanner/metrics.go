package scanner

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the lost-event metrics, prefixed sigwatch_scanner_ and
// labelled family="deadlines" like the engine's own (see shard/queue).
type metrics struct {
	lost, publishErrors, fenced, republishSkipped prometheus.Counter
	fireLag                                       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "sigwatch", Subsystem: "scanner", Name: name, Help: help,
			ConstLabels: prometheus.Labels{"family": family}}
	}
	lag := opts("fire_lag_seconds", "Time from a deadline to its lost event (fired_at - deadline).")
	m := &metrics{
		lost: prometheus.NewCounter(prometheus.CounterOpts(opts("lost_total", "Lost events published and settled."))),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts(opts("publish_errors_total",
			"Events not acknowledged; their entries stay and are retried."))),
		republishSkipped: prometheus.NewCounter(prometheus.CounterOpts(opts("republish_skipped_total",
			"Lost events an earlier owner had stored but not settled, found in the stream and not published again."))),
		fenced: prometheus.NewCounter(prometheus.CounterOpts(opts("fenced_total",
			"Lost events not published because another replica had taken the shard since: the stream refused them, or the lease ran out before they were marked (invariant 11)."))),
		fireLag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: lag.Namespace, Subsystem: lag.Subsystem,
			Name: lag.Name, Help: lag.Help, ConstLabels: lag.ConstLabels, Buckets: prometheus.ExponentialBucketsRange(0.001, 60, 17)}),
	}
	for _, c := range []prometheus.Collector{m.lost, m.publishErrors, m.fenced, m.republishSkipped, m.fireLag} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("scanner: register metrics: %w", err)
		}
	}
	return m, nil
}
