package timer

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/internal/ratelog"
)

// metrics are the generic timers' own (sigwatch_timers_*); the engine's
// are sigwatch_scanner_* with family="timers".
type metrics struct {
	fired         prometheus.Counter
	lag           prometheus.Histogram
	publishErrors prometheus.Counter
	resets        *prometheus.CounterVec
	invalid       *prometheus.CounterVec
	backlog       prometheus.Gauge
	journalled    prometheus.Counter
	journalErrors prometheus.Counter
	// journalRewrites counts timers journalled again because another
	// write changed them in Redis while theirs was journalled.
	journalRewrites prometheus.Counter
	warn            *ratelog.Limiter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "sigwatch", "timers"
	m := &metrics{
		fired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "fired_total",
			Help: "Timer events published."}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "fire_lag_seconds",
			Help:    "Time from a timer's deadline to the claim that fired it.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "publish_errors_total",
			Help: "Timer events not published; the timer stays and fires again."}),
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "resets_total",
			Help: "Timer resets stored, by path (http, nats: the stream, request: NATS request answered once stored)."}, []string{"path"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "invalid_total",
			Help: "Timer resets refused as malformed, by reason; over NATS they go to the invalid subject."}, []string{"reason"}),
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "nats_backlog",
			Help: "Reset messages waiting in the reset stream, not yet stored."}),
		journalled: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "journal_writes_total",
			Help: "Timer states (resets and cancels of durable queues) stored in the timer journal."}),
		journalErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "journal_errors_total",
			Help: "Timer states the journal did not store; their reset or cancel was refused."}),
		journalRewrites: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "journal_rewrites_total",
			Help: "Timer states journalled again: another write changed the timer in Redis while its record was written."}),
		warn: ratelog.New(time.Second, nil),
	}
	for _, c := range []prometheus.Collector{m.fired, m.lag, m.publishErrors, m.resets, m.invalid, m.backlog, m.journalled, m.journalErrors, m.journalRewrites} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("timer: register metrics: %w", err)
		}
	}
	for _, p := range []string{"http", "nats"} {
		m.resets.WithLabelValues(p)
	}
	return m, nil
}

// Stored counts resets stored through path ("http" or "nats").
func (s *Service) Stored(path string, n int) { s.m.resets.WithLabelValues(path).Add(float64(n)) }
