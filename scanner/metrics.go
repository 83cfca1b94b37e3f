package scanner

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the lost-event metrics, prefixed sigwatch_scanner_ and
// labelled family="deadlines" like the engine's own (see shard/queue).
type metrics struct {
	lost          prometheus.Counter
	publishErrors prometheus.Counter
	fireLag       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "sigwatch", "scanner"
	fl := prometheus.Labels{"family": family}
	m := &metrics{
		lost: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "lost_total", ConstLabels: fl,
			Help: "Lost events published and settled."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "publish_errors_total", ConstLabels: fl,
			Help: "Events not acknowledged; their entries stay and are retried."}),
		fireLag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "fire_lag_seconds", ConstLabels: fl,
			Help: "Time from a deadline to its lost event (fired_at - deadline).", Buckets: prometheus.ExponentialBucketsRange(0.001, 60, 17)}),
	}
	for _, c := range []prometheus.Collector{m.lost, m.publishErrors, m.fireLag} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("scanner: register metrics: %w", err)
		}
	}
	return m, nil
}
