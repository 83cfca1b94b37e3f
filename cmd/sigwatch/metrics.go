package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
)

// natsConnected reports the state of the process's NATS connection, which
// every role publishes or reads on.
func natsConnected(pub *dispatch.Bus) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "sigwatch", Subsystem: "nats", Name: "connected",
		Help: "1 while the NATS connection is up (it reconnects by itself; events wait in Redis meanwhile)."},
		func() float64 {
			if pub.Connected() {
				return 1
			}
			return 0
		})
}
