package queue

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the engine's Prometheus metrics. Their names keep the prefix
// sigwatch_scanner_ they had before the engine was its own package
// (dashboards and alert rules use them); a family label tells the timer
// families apart.
type metrics struct {
	claims       prometheus.Counter
	wakes        *prometheus.CounterVec
	deferred     prometheus.Counter
	revived      prometheus.Counter
	leaseLost    prometheus.Counter
	batchSize    prometheus.Histogram
	owned        prometheus.Gauge
	watermarkLag prometheus.Gauge
	shardSize    *prometheus.GaugeVec
	crossing     *prometheus.CounterVec
	drainMoved   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, family string) (*metrics, error) {
	const ns, sub = "sigwatch", "scanner"
	fl := prometheus.Labels{"family": family}
	m := &metrics{
		claims: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "claims_total", ConstLabels: fl,
			Help: "Claims run on the owned shards; an idle shard sleeps until its head is due, so this grows with due work, not with shards."}),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "wakes_total", ConstLabels: fl,
			Help: "Sleeping shard loops woken early, by cause: write (a write landed before the time the loop slept until), " +
				"subscribed (the wake subscription was (re)established: every loop claims again)."}, []string{"cause"}),
		deferred: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "deferred_total", ConstLabels: fl,
			Help: "Due entries moved later instead of fired (by the outage rule or another handler decision)."}),
		revived: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "revived_total", ConstLabels: fl,
			Help: "Fired entries a reset revived between claim and settle."}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "lease_lost_total", ConstLabels: fl,
			Help: "Shard leases found lost while held."}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "claim_batch_size", ConstLabels: fl,
			Help: "Entries per non-empty claim.", Buckets: prometheus.ExponentialBuckets(1, 2, 14)}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "owned_shards", ConstLabels: fl,
			Help: "Shards whose lease this replica holds."}),
		watermarkLag: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "watermark_lag_seconds", ConstLabels: fl,
			Help: "How far the ingest watermark is behind the clock."}),
		shardSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "shard_size", ConstLabels: fl,
			Help: "Timers in each owned shard, updated every few seconds."}, []string{"shard"}),
		crossing: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "crossing_total", ConstLabels: fl,
			Help: "Due entries of moved devices checked against their partner shard during a doubling, by outcome: " +
				"fire, stale (the partner holds a later deadline; removed unfired), fired_elsewhere (removed unfired)."}, []string{"outcome"}),
		drainMoved: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "drain_moved", ConstLabels: fl,
			Help: "Moved timers left in the old shards this replica owns while a doubling drains; 0 otherwise."}),
	}
	for _, c := range []prometheus.Collector{m.claims, m.wakes, m.deferred, m.revived, m.leaseLost, m.batchSize, m.owned,
		m.watermarkLag, m.shardSize, m.crossing, m.drainMoved} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("queue: register metrics: %w", err)
		}
	}
	return m, nil
}
