package scanner

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the scanner's Prometheus metrics, prefixed sigwatch_scanner_.
type metrics struct {
	lost          prometheus.Counter
	deferred      prometheus.Counter
	revived       prometheus.Counter
	publishErrors prometheus.Counter
	leaseLost     prometheus.Counter
	batchSize     prometheus.Histogram
	fireLag       prometheus.Histogram
	owned         prometheus.Gauge
	watermarkLag  prometheus.Gauge
	shardSize     *prometheus.GaugeVec
	crossing      *prometheus.CounterVec
	drainMoved    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "sigwatch", "scanner"
	m := &metrics{
		lost: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "lost_total",
			Help: "Lost events published and settled."}),
		deferred: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "deferred_total",
			Help: "Due entries moved later instead of fired (outage rule, or by a Fire hook)."}),
		revived: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "revived_total",
			Help: "Fired entries a reset revived between claim and settle."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "publish_errors_total",
			Help: "Events not acknowledged; their entries stay and are retried."}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "lease_lost_total",
			Help: "Shard leases found lost while held."}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "claim_batch_size",
			Help: "Entries per non-empty claim.", Buckets: prometheus.ExponentialBuckets(1, 2, 14)}),
		fireLag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "fire_lag_seconds",
			Help: "Time from a deadline to its lost event (fired_at - deadline).", Buckets: prometheus.ExponentialBucketsRange(0.001, 60, 17)}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "owned_shards",
			Help: "Shards whose lease this replica holds."}),
		watermarkLag: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "watermark_lag_seconds",
			Help: "How far the ingest watermark is behind the clock."}),
		shardSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "shard_size",
			Help: "Timers in each owned shard, updated every few seconds."}, []string{"shard"}),
		crossing: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "crossing_total",
			Help: "Due entries of moved devices checked against their partner shard during a doubling, by outcome: " +
				"fire, stale (the partner holds a later deadline; removed unfired), fired_elsewhere (removed unfired)."}, []string{"outcome"}),
		drainMoved: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "drain_moved",
			Help: "Moved timers left in the old shards this replica owns while a doubling drains; 0 otherwise."}),
	}
	for _, c := range []prometheus.Collector{m.lost, m.deferred, m.revived, m.publishErrors, m.leaseLost,
		m.batchSize, m.fireLag, m.owned, m.watermarkLag, m.shardSize, m.crossing, m.drainMoved} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("scanner: register metrics: %w", err)
		}
	}
	return m, nil
}

// limitedLog logs a warning at most once per period for each key and says
// how many were suppressed in between, so a Redis or NATS outage does not
// flood the log.
type limitedLog struct {
	log    *slog.Logger
	period time.Duration

	mu      sync.Mutex
	last    map[string]time.Time
	dropped map[string]int
}

func newLimitedLog(log *slog.Logger, period time.Duration) *limitedLog {
	return &limitedLog{log: log, period: period, last: map[string]time.Time{}, dropped: map[string]int{}}
}

// Warn logs msg unless key was logged less than a period ago.
func (l *limitedLog) Warn(key, msg string, args ...any) {
	l.mu.Lock()
	now := time.Now()
	if t, ok := l.last[key]; ok && now.Sub(t) < l.period {
		l.dropped[key]++
		l.mu.Unlock()
		return
	}
	l.last[key] = now
	n := l.dropped[key]
	delete(l.dropped, key)
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	l.log.Warn(msg, args...)
}
