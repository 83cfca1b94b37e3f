package stats

import (
	"math"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// The metrics the reports are taken from, by their full names.
const (
	metricSignals   = "sigwatch_ingest_signals_total"
	metricRecovered = "sigwatch_ingest_recovered_total"
	metricInvalid   = "sigwatch_ingest_invalid_total"
	metricLost      = "sigwatch_scanner_lost_total"
	metricFireLag   = "sigwatch_scanner_fire_lag_seconds"
	metricAlarms    = "sigwatch_alarm_active"
	metricConnected = "sigwatch_ingest_connected"
)

// The state labels of sigwatch_alarm_active, as package alarm sets them
// (stats is a role beside alarm and does not import it).
const (
	stateRaised   = "raised"
	stateAcked    = "acked"
	stateFlapping = "flapping"
	stateHeld     = "held"
)

// Counts are the events a process counted over a span.
type Counts struct {
	Signals   int64 `json:"signals"`
	Lost      int64 `json:"lost"`
	Recovered int64 `json:"recovered"`
	Invalid   int64 `json:"invalid"`
}

func (c Counts) minus(o Counts) Counts {
	return Counts{c.Signals - o.Signals, c.Lost - o.Lost, c.Recovered - o.Recovered, c.Invalid - o.Invalid}
}

func (c Counts) plus(o Counts) Counts {
	return Counts{c.Signals + o.Signals, c.Lost + o.Lost, c.Recovered + o.Recovered, c.Invalid + o.Invalid}
}

// AlarmCounts are the open alarms by state. Held alarms are open but not
// raised: a storm's one alarm speaks for them, or they wait out the storm
// hold to see whether a storm takes them in.
type AlarmCounts struct {
	Active   int64 `json:"active"`
	Held     int64 `json:"held"`
	Acked    int64 `json:"acked"`
	Flapping int64 `json:"flapping"`
}

// sample is one reading of a process's metrics.
type sample struct {
	at     time.Time
	counts Counts
	// lag holds the fire-lag histogram's cumulative counts by upper bound
	// (seconds), +Inf included.
	lag    map[float64]uint64
	alarms AlarmCounts
	// brokerDown: this process's ingest has lost its MQTT broker.
	brokerDown bool
}

// readSample takes the counters a report needs from a gathering of the
// process's registry; a metric a role does not register reads 0.
func readSample(at time.Time, mfs []*dto.MetricFamily) sample {
	x := sample{at: at}
	for _, mf := range mfs {
		var sum float64
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
		switch mf.GetName() {
		case metricSignals:
			x.counts.Signals = int64(sum)
		case metricRecovered:
			x.counts.Recovered = int64(sum)
		case metricInvalid:
			x.counts.Invalid = int64(sum)
		case metricLost:
			x.counts.Lost = int64(sum)
		case metricFireLag:
			x.lag = map[float64]uint64{}
			for _, m := range mf.GetMetric() {
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					x.lag[b.GetUpperBound()] += b.GetCumulativeCount()
				}
				x.lag[math.Inf(1)] += h.GetSampleCount()
			}
		case metricConnected:
			for _, m := range mf.GetMetric() {
				x.brokerDown = x.brokerDown || m.GetGauge().GetValue() == 0
			}
		case metricAlarms:
			for _, m := range mf.GetMetric() {
				v := int64(m.GetGauge().GetValue())
				for _, l := range m.GetLabel() {
					if l.GetName() != "state" {
						continue
					}
					switch l.GetValue() {
					case stateRaised:
						x.alarms.Active = v
					case stateAcked:
						x.alarms.Acked = v
					case stateFlapping:
						x.alarms.Flapping = v
					case stateHeld:
						x.alarms.Held = v
					}
				}
			}
		}
	}
	return x
}
