package alarm

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sigwatch/sigwatch/internal/periodic"
)

// metrics are the alarm's Prometheus metrics, prefixed sigwatch_alarm_.
type metrics struct {
	active        *prometheus.GaugeVec
	flapping      prometheus.Gauge
	notifications *prometheus.CounterVec
	suppressed    *prometheus.CounterVec
	events        *prometheus.CounterVec
	publishErrors prometheus.Counter
	repeatLag     prometheus.Histogram
	held          prometheus.Counter
	storms        *prometheus.CounterVec
	stormsActive  *prometheus.GaugeVec
	// The rate limits' (rate.go): notes given a later slot, repeats
	// coalesced while waiting for one, and how long notes wait.
	delayed   *prometheus.CounterVec
	coalesced prometheus.Counter
	delay     prometheus.Histogram
	lateness  prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "sigwatch", "alarm"
	m := &metrics{
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "active",
			Help: "Open alarms by state (raised: repeating; acked: paused by an ack with an end; flapping), " +
				"counted every few seconds by the replica that owns repeat shard 0 (0 on the others)."}, []string{"state"}),
		flapping: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "flapping",
			Help: "Devices whose alarm is flapping, counted like active."}),
		notifications: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "notifications_total",
			Help: "Alarm notifications published, by state."}, []string{"state"}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "suppressed_total",
			Help: "Alarm notifications a mute suppressed, by state."}, []string{"state"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "events_total",
			Help: "Lost and recovered events handled, by event and whether they changed an alarm."}, []string{"event", "changed"}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "publish_errors_total",
			Help: "Notifications not acknowledged by JetStream; they stay pending and are retried."}),
		repeatLag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "repeat_lag_seconds",
			Help:    "Time from when a repeat (or the end of an ack) was due to when it was handled.",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 600, 20)}),
		held: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "held_total",
			Help: "Device alarm notifications (a raise, or a repeat) held back because a storm of the device's group or of the fleet speaks for it."}),
		storms: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "storms_total",
			Help: "Storm transitions decided by this process, by scope (group, fleet) and state (started, ended)."}, []string{"scope", "state"}),
		stormsActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "storms_active",
			Help: "Storms going on, by scope, counted like active."}, []string{"scope"}),
		delayed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "notifications_delayed_total",
			Help: "Notifications the rate limits (alarm.rate, alarm.rate_total) gave a later send slot, by subject token (the type, or \"other\" beyond nats.max_types)."}, []string{"type"}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "notifications_coalesced_total",
			Help: "Repeats replaced by a later repeat of the same alarm while waiting for their send slot."}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "notification_delay_seconds",
			Help:    "Time from when a notification was decided to its send slot under the rate limits.",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 3600, 20)}),
		lateness: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "notification_lateness_seconds",
			Help: "Time from a paced notification's send slot to JetStream's acknowledgement of it: how far " +
				"publication trails the pace (a second of publications holds the slots of a second plus this).",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}}),
	}
	for _, c := range []prometheus.Collector{m.active, m.flapping, m.notifications, m.suppressed, m.events,
		m.publishErrors, m.repeatLag, m.held, m.storms, m.stormsActive, m.delayed, m.coalesced, m.delay, m.lateness} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("alarm: register metrics: %w", err)
		}
	}
	for _, sc := range []string{"group", "fleet"} {
		for _, s := range []string{StormStarted, StormEnded} {
			m.storms.WithLabelValues(sc, s)
		}
	}
	for _, s := range []string{Raised, Acked, Flapping, Held} {
		m.active.WithLabelValues(s)
	}
	return m, nil
}

func (m *metrics) notified(n Note) {
	if n.Muted {
		m.suppressed.WithLabelValues(n.State).Inc()
		return
	}
	m.notifications.WithLabelValues(n.State).Inc()
}

func (m *metrics) handled(event string, changed bool) {
	c := "false"
	if changed {
		c = "true"
	}
	m.events.WithLabelValues(event, c).Inc()
}

// counts are the open alarms by state.
type counts struct {
	raised, acked, flapping, held int
	groupStorms, fleetStorms      int // going on
}

func (m *metrics) set(c counts) {
	m.active.WithLabelValues(Raised).Set(float64(c.raised))
	m.active.WithLabelValues(Acked).Set(float64(c.acked))
	m.active.WithLabelValues(Flapping).Set(float64(c.flapping))
	m.active.WithLabelValues(Held).Set(float64(c.held))
	m.flapping.Set(float64(c.flapping))
	m.stormsActive.WithLabelValues("group").Set(float64(c.groupStorms))
	m.stormsActive.WithLabelValues("fleet").Set(float64(c.fleetStorms))
}

// count counts the open alarms from the open-alarm index: the idle states
// of every device that ever alarmed are not read. Held alarms are counted
// by the storm that holds them: their group's, else the fleet's, else ""
// (waiting out the storm hold).
func (a *Alarms) count(ctx context.Context) (counts, map[string]int64, error) {
	if err := a.ensureIndex(ctx, true); err != nil {
		return counts{}, nil, fmt.Errorf("alarm: count alarms: %w", err)
	}
	var out counts
	storms, err := a.Storms(ctx, 100)
	if err != nil {
		return counts{}, nil, fmt.Errorf("alarm: count storms: %w", err)
	}
	groupStorm := map[string]bool{}
	fleetStorm := false
	for _, s := range storms {
		switch {
		case s.State != StormActive:
		case s.Scope == "fleet":
			out.fleetStorms++
			fleetStorm = true
		default:
			out.groupStorms++
			groupStorm[s.Group] = true
		}
	}
	held := map[string]int64{}
	err = a.openStates(ctx, func(_, v string) {
		var st struct {
			Phase      Phase  `json:"phase"`
			AckedUntil int64  `json:"acked_until"`
			Held       bool   `json:"held"`
			Group      string `json:"group"`
		}
		if json.Unmarshal([]byte(v), &st) != nil {
			return
		}
		switch {
		case st.Phase == Damped:
			out.flapping++
		case st.Phase == Active && st.AckedUntil > 0:
			out.acked++
		case st.Phase == Active && st.Held:
			out.held++
			switch {
			case st.Group != "" && groupStorm[st.Group]:
				held[groupScope(st.Group)]++
			case fleetStorm:
				held[fleetScope]++
			default:
				held[""]++
			}
		case st.Phase == Active:
			out.raised++
		}
	})
	if err != nil {
		return counts{}, nil, fmt.Errorf("alarm: count alarms: %w", err)
	}
	return out, held, nil
}

// countLoop refreshes the active gauges every period while this replica
// owns repeat shard 0, and zeroes them otherwise, until ctx is done.
func (a *Alarms) countLoop(ctx context.Context, owned func() []int, every time.Duration) {
	periodic.Run(ctx, every, func(time.Time) {
		own := owned()
		if len(own) == 0 || own[0] != 0 {
			a.m.set(counts{})
			return
		}
		c, held, err := a.count(ctx)
		if err == nil {
			// Kept a few periods: a new owner of repeat shard 0 takes over.
			err = a.writeHeld(ctx, held, max(5*every, 10*time.Second))
		}
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("counting open alarms failed", "err", err)
			}
			return
		}
		a.m.set(c)
	})
}

// stormTransition counts a storm transition this process decided.
func (m *metrics) stormTransition(st stormState) {
	if n := len(st.Pending); n > 0 {
		ev := st.Pending[n-1]
		m.storms.WithLabelValues(ev.Scope, ev.State).Inc()
	}
}
