package guard

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	losses          prometheus.Counter
	restoring       prometheus.Gauge
	restoredDevices prometheus.Gauge
	restoredTimers  prometheus.Gauge
	checkpoints     prometheus.Counter
	cleanRestarts   prometheus.Counter
}

func newMetrics(r prometheus.Registerer) *metrics {
	m := &metrics{
		losses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sigwatch_redis_data_loss_total",
			Help: "Times this process found that Redis lost or rolled back data (generation missing or behind, or a restart after which the registry check found data missing).",
		}),
		restoring: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sigwatch_redis_restoring",
			Help: "1 while this process holds work because Redis lost data or restarted, and is being checked and restored.",
		}),
		restoredDevices: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sigwatch_redis_restored_devices",
			Help: "Devices the last restore by this process put back from the durable registry.",
		}),
		restoredTimers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sigwatch_redis_restored_timers",
			Help: "Generic timers the last restore by this process put back from the timer journal.",
		}),
		checkpoints: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sigwatch_registry_checkpoints_total",
			Help: "Times this process copied the lost marks into the durable registry.",
		}),
		cleanRestarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sigwatch_redis_clean_restarts_total",
			Help: "Times this process proved that a Redis restart kept everything it acknowledged (appendfsync always) and worked on without a restore.",
		}),
	}
	if r != nil {
		r.MustRegister(m.losses, m.restoring, m.restoredDevices, m.restoredTimers, m.checkpoints, m.cleanRestarts)
	}
	return m
}
