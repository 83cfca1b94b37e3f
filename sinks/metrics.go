package sinks

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the sinks' own: what each sent and how, how long a call
// took, what waits for it and how long its budget held notifications back.
type metrics struct {
	sentTotal *prometheus.CounterVec
	lat       *prometheus.HistogramVec
	depth     *prometheus.GaugeVec
	waits     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		sentTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sigwatch", Subsystem: "sink", Name: "sent_total",
			Help: "Notifications handled by each sink, by outcome: sent, retried (an attempt the sink may take later), failed (to the dead letters), gone (the sink answered 410 and was disabled), duplicate, skipped (not for this sink), unreadable."},
			[]string{"sink", "outcome"}),
		lat: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "sigwatch", Subsystem: "sink", Name: "latency_seconds",
			Help: "How long one call to a sink took.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}, []string{"sink"}),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "sigwatch", Subsystem: "sink", Name: "queue_depth",
			Help: "Notifications waiting for each sink, the one in hand included."}, []string{"sink"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sigwatch", Subsystem: "sink", Name: "budget_wait_seconds_total",
			Help: "Time notifications waited for their sink's budget (rate)."}, []string{"sink"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.sentTotal, m.lat, m.depth, m.waits} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) sent(sink, outcome string) { m.sentTotal.WithLabelValues(sink, outcome).Inc() }

func (m *metrics) latency(sink string, d time.Duration) {
	m.lat.WithLabelValues(sink).Observe(d.Seconds())
}

func (m *metrics) budgetWait(sink string) func(time.Duration) {
	return func(d time.Duration) { m.waits.WithLabelValues(sink).Add(d.Seconds()) }
}
