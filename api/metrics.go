package api

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the API's own: refused authentications and the answers the
// throttle held back.
type metrics struct {
	authFailures *prometheus.CounterVec
	throttled    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sigwatch", Subsystem: "http", Name: "auth_failures_total",
			Help: "Requests refused for their token: missing, wrong (unknown or revoked), or role (a known token of too low a role)."}, []string{"reason"}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sigwatch", Subsystem: "http", Name: "auth_throttled_total",
			Help: "Refused requests whose answer was held back or answered 429 because their address kept failing authentication."}),
	}
	if reg != nil {
		m.authFailures = register(reg, m.authFailures)
		m.throttled = register(reg, m.throttled)
	}
	return m
}

// register registers c, or returns the collector registered before it (a
// second API on one registry shares the first's counts).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	switch {
	case err == nil:
		return c
	case errors.As(err, &are):
		if old, ok := are.ExistingCollector.(C); ok {
			return old
		}
	}
	panic(err) // the API's metrics are fixed at build time
}
