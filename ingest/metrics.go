package ingest

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/shard"
)

type metrics struct {
	signals     prometheus.Counter
	resets      prometheus.Counter
	invalid     map[string]prometheus.Counter // by reason
	unforwarded prometheus.Counter
	newDevices  prometheus.Counter
	recovered   prometheus.Counter
	stale       prometheus.Counter
	storeErrors prometheus.Counter
	// brokerOutages counts the connection's breaks, reconnectGraces those
	// given the reconnect grace (see breaks).
	brokerOutages, reconnectGraces prometheus.Counter
	batchSize                      prometheus.Histogram
	storeLatency                   prometheus.Histogram
	// declared counts deadlines devices declared, clamped those cut to
	// thresholds.max_declared; offline and lowered the offline reports
	// and those that brought a deadline down, by reason.
	declared, clamped prometheus.Counter
	// staleDeaths counts Sparkplug NDEATHs of an earlier connection or
	// repeated, which change nothing.
	staleDeaths prometheus.Counter
	// staleConns counts connection events older than the device's latest.
	staleConns       prometheus.Counter
	offline, lowered map[string]prometheus.Counter

	all []prometheus.Collector // everything register registers
}

// newMetrics builds ingest's metrics. The gauges read in's stages when
// gathered: register them only once the stages are built.
func newMetrics(in *Ingest) *metrics {
	const ns, sub = "sigwatch", "ingest"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	invalid := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "invalid_total",
		Help: "Messages refused, by reason."}, []string{"reason"})
	m := &metrics{
		signals:     counter("signals_total", "Signals whose deadline was stored."),
		resets:      counter("resets_total", "Signals that pushed the deadline of a device already watched."),
		invalid:     make(map[string]prometheus.Counter),
		unforwarded: counter("invalid_unforwarded_total", "Refused messages acked without reaching the dead-letter subject (queue full or NATS failing)."),
		newDevices:  counter("new_devices_total", "Devices seen for the first time."),
		recovered:   counter("recovered_total", "Lost devices that signalled again."),
		stale: counter("stale_signals_total",
			"Signals refused because nothing shows they are newer than their device's loss (a late delivery: a stalled replica's backlog, a redelivery); acked, not stored."),
		storeErrors: counter("store_errors_total", "Failed Redis calls (each is retried)."),
		brokerOutages: counter("broker_outages_total",
			"Times the connection to the MQTT broker was lost and came back: each is recorded as an ingest outage, whatever its length."),
		reconnectGraces: counter("reconnect_graces_total",
			"Broker outages after which devices were given ingest.reconnect_grace to reconnect: the broker restarted, or did not show it kept running."),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "flush_batch_size",
			Help: "Signals per flush to Redis.", Buckets: prometheus.ExponentialBuckets(1, 2, 13)}),
		storeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "store_latency_seconds",
			Help: "Latency of one deadline write to Redis (all shards of a flush).", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
	}
	for _, r := range append(reasons, &InvalidError{Reason: "other"}) {
		m.invalid[r.Reason] = invalid.WithLabelValues(r.Reason)
	}
	for r := range sparkplugRefusals {
		m.invalid[r] = invalid.WithLabelValues(r)
	}
	m.staleConns = counter("stale_connection_events_total", "Connection events ignored: older than the device's latest (its version), or repeated.")
	m.staleDeaths = counter("sparkplug_stale_deaths_total", "Sparkplug NDEATHs ignored: of an earlier connection than the node's current birth (bdSeq), or repeated.")
	m.declared = counter("declared_deadlines_total", "Signals whose deadline the device declared (ttd, next).")
	m.clamped = counter("declared_clamped_total", "Declared deadlines cut to thresholds.max_declared.")
	offline := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "offline_reports_total",
		Help: "Offline reports received (a will or status offline, a death, a disconnect, ttd 0), by reason."}, []string{"reason"})
	lowered := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "offline_lowered_total",
		Help: "Offline reports that brought a watched device's deadline down (the others found it lost, unknown, or alive since), by reason."}, []string{"reason"})
	m.offline, m.lowered = map[string]prometheus.Counter{}, map[string]prometheus.Counter{}
	for _, r := range []string{shard.ReasonWill, shard.ReasonDeath, shard.ReasonDisconnect, shard.ReasonDeclared} {
		m.offline[r], m.lowered[r] = offline.WithLabelValues(r), lowered.WithLabelValues(r)
	}
	gauges := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "inflight",
			Help: "Signals received but not yet stored and acked."},
			func() float64 { return float64(len(in.pipe.slots)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "watermark_age_seconds",
			Help: "Seconds since the watermark this instance last stored (since start before the first)."},
			func() float64 { return in.wm.age(in.opts.Now()) }),
	}
	// The MQTT metrics exist only where MQTT is configured, so that an
	// alert on them never fires for a fleet that sends over HTTP only.
	if len(in.opts.Brokers) > 0 {
		gauges = append(gauges, m.brokerOutages, m.reconnectGraces,
			prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "broker_dropped_total",
				Help: "Messages the MQTT broker dropped while this process listened: the increases of its $SYS/broker/publish/messages/dropped " +
					"from one report to the next (the first report on each connection, and a lower count after a broker restart, are baselines)."},
				func() float64 { return float64(in.src.droppedSeen.Load()) }),
			knownGauge{desc: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "broker_dropped_messages"),
				"The MQTT broker's own count of messages it dropped ($SYS/broker/publish/messages/dropped) since it started; absent until it reports.", nil, nil),
				value: func() (float64, bool) { n := in.src.brokerDropped.Load(); return float64(n), n >= 0 }},
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "connected",
				Help: "1 while connected to the MQTT broker and subscribed; absent where no broker is configured."},
				func() float64 {
					if in.Connected() {
						return 1
					}
					return 0
				}))
	}
	m.all = append([]prometheus.Collector{m.signals, m.resets, invalid, m.unforwarded, m.newDevices, m.recovered,
		m.stale, m.storeErrors, m.batchSize, m.storeLatency, m.declared, m.clamped, m.staleDeaths, m.staleConns, offline, lowered}, gauges...)
	return m
}

// register registers the metrics on reg, if it is not nil.
func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range m.all {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("ingest: register metrics: %w", err)
		}
	}
	return nil
}

// knownGauge is a gauge exported only while value knows it.
type knownGauge struct {
	desc  *prometheus.Desc
	value func() (float64, bool)
}

func (g knownGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g knownGauge) Collect(ch chan<- prometheus.Metric) {
	if v, ok := g.value(); ok {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, v)
	}
}
