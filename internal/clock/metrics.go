package clock

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the clock's Prometheus metrics, prefixed sigwatch_clock_.
type metrics struct {
	offset      prometheus.Gauge
	uncertainty prometheus.Gauge
	errors      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "sigwatch", "clock"
	m := &metrics{
		offset: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "offset_seconds",
			Help: "Redis server time minus this host's clock, as last estimated; sigwatch runs on Redis time, " +
				"so a large value is a host clock problem, not a sigwatch one."}),
		uncertainty: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "uncertainty_seconds",
			Help: "Bound of the error of the offset: half the round trip of the TIME sample it came from."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "sync_errors_total",
			Help: "Refreshes of the offset that failed; the last offset stays in force."}),
	}
	for _, c := range []prometheus.Collector{m.offset, m.uncertainty, m.errors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("clock: register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) set(s sample) {
	m.offset.Set(s.offset.Seconds())
	m.uncertainty.Set((s.rtt / 2).Seconds())
}
