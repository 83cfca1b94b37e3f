package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/internal/periodic"
	"github.com/sigwatch/sigwatch/shard"
)

// Fleet-wide stats. No process sees the whole fleet's rates: ingest counts
// signals and recoveries, scanners count losses and fire lag, the alarm
// role counts alarms, and each may run anywhere. So every process reports
// what its own metrics counted over its last minute into one Redis HASH
// (shard.Store.Report) every second, and GET /v1/stats, on any process with
// the api role, sums the fresh reports and adds what Redis itself knows:
// the watched and lost counts, the watermark and its outages, the topology
// and its drain.

const (
	// reportEvery is how often each process reports.
	reportEvery = time.Second
	// reportMaxAge is how old a report may be before its process counts as
	// gone; it is also how long the HASH lives after the last report.
	reportMaxAge = 10 * time.Second
	// rateWindow is the span signals/s and lost/s are measured over: short
	// enough to follow a change within seconds, long enough to smooth the
	// batches ingest and the scanners work in.
	rateWindow = 5 * time.Second
	// statsCacheFor is how long one computation of the stats answers every
	// request: a status page polling every second from many browsers costs
	// Redis one computation per second per process.
	statsCacheFor = time.Second
	// historyLen is the number of one-second points of the fire-lag chart.
	historyLen = 60
	// lastOutages is how many of the latest outages the stats show.
	lastOutages = 5
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

// counts are the events a process counted over a span.
type counts struct {
	Signals   int64 `json:"signals"`
	Lost      int64 `json:"lost"`
	Recovered int64 `json:"recovered"`
	Invalid   int64 `json:"invalid"`
}

func (c counts) minus(o counts) counts {
	return counts{c.Signals - o.Signals, c.Lost - o.Lost, c.Recovered - o.Recovered, c.Invalid - o.Invalid}
}

func (c counts) plus(o counts) counts {
	return counts{c.Signals + o.Signals, c.Lost + o.Lost, c.Recovered + o.Recovered, c.Invalid + o.Invalid}
}

// alarmCounts are the open alarms by state.
type alarmCounts struct {
	Active   int64 `json:"active"`
	Acked    int64 `json:"acked"`
	Flapping int64 `json:"flapping"`
}

// sample is one reading of a process's metrics.
type sample struct {
	at     time.Time
	counts counts
	// lag holds the fire-lag histogram's cumulative counts by upper bound
	// (seconds), +Inf included.
	lag    map[float64]uint64
	alarms alarmCounts
	// brokerDown: this process's ingest has lost its MQTT broker.
	brokerDown bool
}

// procReport is the body of one process's report.
type procReport struct {
	Roles []string `json:"roles"`
	// SpanMS is what Minute covers: a minute, less just after start.
	SpanMS int64  `json:"span_ms"`
	Minute counts `json:"minute"`
	// RecentSpanMS is what Recent covers, about rateWindow.
	RecentSpanMS int64  `json:"recent_span_ms"`
	Recent       counts `json:"recent"`
	// FireLag is the fire-lag histogram over Minute's span: cumulative
	// counts by upper bound in seconds ("+Inf" for the last).
	FireLag map[string]uint64 `json:"fire_lag,omitempty"`
	// Alarms is present on processes that run the alarm role; only the one
	// that owns repeat shard 0 counts, the others say 0.
	Alarms *alarmCounts `json:"alarms,omitempty"`
	// BrokerDown says the process runs ingest and its connection to the
	// MQTT broker is down: an outage in progress, however short.
	BrokerDown bool `json:"broker_down,omitempty"`
}

// fleetStats reports this process's counts and, with the api role, serves
// GET /v1/stats and keeps its history.
type fleetStats struct {
	name        string
	roles       []string
	store       *shard.Store
	reg         prometheus.Gatherer
	now         func() time.Time
	alarms      *alarm.Alarms // nil without alarms (NATS core mode)
	outageAfter time.Duration
	api         bool
	log         *slog.Logger

	// ring holds the samples of the last minute, oldest first; only the
	// report loop touches it.
	ring []sample

	mu       sync.Mutex // serialises computations; guards cached and cachedAt
	cached   statsView
	cachedAt time.Time

	histMu  sync.Mutex
	history []historyPoint
}

func newFleetStats(a *App) *fleetStats {
	s := &fleetStats{name: replicaID(), roles: slices.Clone(a.cfg.Roles), store: a.store, reg: a.reg,
		now: a.clock.Now, alarms: a.alarms, outageAfter: a.cfg.Ingest.OutageAfter, api: a.cfg.hasRole("api"),
		log: a.log.With("role", "stats")}
	slices.Sort(s.roles)
	return s
}

// start runs the report loop and, with the api role, the history loop in g.
func (s *fleetStats) start(g *group) {
	g.Go("reports", s.reportLoop)
	if s.api {
		g.Go("stats history", s.historyLoop)
	}
}

// reportLoop reports every reportEvery until ctx is done, then withdraws
// the report so that a process stopped on purpose drops out at once.
func (s *fleetStats) reportLoop(ctx context.Context) error {
	s.report(ctx)
	periodic.Run(ctx, reportEvery, func(time.Time) { s.report(ctx) })
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := s.store.Unreport(uctx, s.name); err != nil {
		s.log.Debug("withdrawing the report failed", "err", err)
	}
	return nil
}

func (s *fleetStats) report(ctx context.Context) {
	mfs, err := s.reg.Gather()
	if err != nil {
		s.log.Warn("gathering metrics for the report failed", "err", err)
		return
	}
	now := s.now()
	s.ring = append(s.ring, readSample(now, mfs))
	for len(s.ring) > 1 && now.Sub(s.ring[1].at) >= time.Minute {
		s.ring = s.ring[1:]
	}
	body, err := json.Marshal(s.body())
	if err != nil {
		return
	}
	if err := s.store.Report(ctx, s.name, shard.Report{At: now.UnixMilli(), Body: string(body)}, reportMaxAge); err != nil && ctx.Err() == nil {
		s.log.Warn("report failed", "err", err)
	}
}

// body is the report of the samples in the ring.
func (s *fleetStats) body() procReport {
	last, first := s.ring[len(s.ring)-1], s.ring[0]
	recent := first
	for _, x := range slices.Backward(s.ring) {
		recent = x
		if last.at.Sub(x.at) >= rateWindow {
			break
		}
	}
	r := procReport{Roles: s.roles, SpanMS: last.at.Sub(first.at).Milliseconds(), Minute: last.counts.minus(first.counts),
		RecentSpanMS: last.at.Sub(recent.at).Milliseconds(), Recent: last.counts.minus(recent.counts)}
	if len(last.lag) > 0 {
		r.FireLag = make(map[string]uint64, len(last.lag))
		for le, c := range last.lag {
			r.FireLag[leString(le)] = c - first.lag[le]
		}
	}
	if slices.Contains(s.roles, "alarm") {
		r.Alarms = &last.alarms
	}
	r.BrokerDown = last.brokerDown
	return r
}

func leString(le float64) string {
	if math.IsInf(le, 1) {
		return "+Inf"
	}
	return fmt.Sprint(le)
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
					case alarm.Raised:
						x.alarms.Active = v
					case "acked":
						x.alarms.Acked = v
					case alarm.Flapping:
						x.alarms.Flapping = v
					}
				}
			}
		}
	}
	return x
}

// statsView is GET /v1/stats.
type statsView struct {
	// At is when the stats were computed (Redis time, unix ms).
	At int64 `json:"at"`
	// Watched devices have a deadline; Lost ones are lost now. During a
	// doubling Watched may count a moved device twice until its old copy
	// drains (at most Shards.Drain.MovedLeft more).
	Watched int64 `json:"watched"`
	Lost    int64 `json:"lost"`
	// Alarms is null when no process runs the alarm role.
	Alarms *alarmsView `json:"alarms"`
	// SignalsPerSec and LostPerSec are measured over the last few seconds.
	SignalsPerSec float64 `json:"signals_per_sec"`
	LostPerSec    float64 `json:"lost_per_sec"`
	LastMinute    counts  `json:"last_minute"`
	FireLag       lagView `json:"fire_lag"`
	Watermark     wmView  `json:"watermark"`
	Shards        topView `json:"shards"`
	// Processes are those whose report is fresh, by name.
	Processes []procView `json:"processes"`
	// History is the last minute, one point a second, oldest first.
	History []historyPoint `json:"history"`
}

// alarmsView counts the open alarms by state, and the mutes in force.
type alarmsView struct {
	alarmCounts
	Mutes int64 `json:"mutes"`
}

// lagView is the fire lag of the last minute's lost events: quantiles of
// the merged histograms of every scanner, null when nothing fired.
type lagView struct {
	P50   *float64 `json:"p50_ms"`
	P99   *float64 `json:"p99_ms"`
	Count int64    `json:"count"`
}

// wmView is the ingest watermark against Redis time.
type wmView struct {
	At    int64 `json:"at"` // 0 before ingest first ran
	AgeMS int64 `json:"age_ms"`
	// Outage says ingest is not known to be consuming now: the watermark
	// is older than ingest.outage_after, or an ingest process lost its
	// broker (BrokerDown names them).
	Outage     bool     `json:"outage"`
	BrokerDown []string `json:"broker_down,omitempty"`
	// GraceUntil, while a reconnect grace runs after a broker restart, is
	// when it ends: devices silent until then are not declared lost before
	// a threshold after it.
	GraceUntil   int64          `json:"grace_until,omitempty"`
	OutagesTotal int64          `json:"outages_total"`
	Outages      []shard.Outage `json:"outages"` // the latest, oldest first
}

// topView is the topology and the progress of its doubling.
type topView struct {
	Count    int       `json:"count"`
	Prev     int       `json:"prev"`
	Epoch    int64     `json:"epoch"`
	Draining bool      `json:"draining"`
	Drain    drainView `json:"drain"`
}

type procView struct {
	Name  string   `json:"name"`
	Roles []string `json:"roles"`
	AgeMS int64    `json:"age_ms"`
}

// historyPoint is one second of the fire-lag chart.
type historyPoint struct {
	At            int64    `json:"at"`
	P50           *float64 `json:"p50_ms"`
	P99           *float64 `json:"p99_ms"`
	SignalsPerSec float64  `json:"signals_per_sec"`
	LostPerSec    float64  `json:"lost_per_sec"`
}

// fleetReports is the sum of the fresh reports.
type fleetReports struct {
	signalsPerSec, lostPerSec float64
	minute                    counts
	lag                       lagView
	alarms                    *alarmCounts
	procs                     []procView
	brokerDown                []string // processes whose broker connection is down
}

// readReports reads and sums the fresh reports at now.
func (s *fleetStats) readReports(ctx context.Context, now time.Time) (fleetReports, error) {
	rs, err := s.store.Reports(ctx, now, reportMaxAge)
	if err != nil {
		return fleetReports{}, err
	}
	f := fleetReports{procs: []procView{}}
	lag := map[float64]uint64{}
	for name, r := range rs {
		var b procReport
		if json.Unmarshal([]byte(r.Body), &b) != nil {
			continue
		}
		f.procs = append(f.procs, procView{Name: name, Roles: b.Roles, AgeMS: now.UnixMilli() - r.At})
		if b.BrokerDown {
			f.brokerDown = append(f.brokerDown, name)
		}
		f.minute = f.minute.plus(b.Minute)
		if b.RecentSpanMS > 0 {
			f.signalsPerSec += float64(b.Recent.Signals) * 1000 / float64(b.RecentSpanMS)
			f.lostPerSec += float64(b.Recent.Lost) * 1000 / float64(b.RecentSpanMS)
		}
		for le, c := range b.FireLag {
			var v float64
			if _, err := fmt.Sscan(le, &v); err == nil {
				lag[v] += c
			}
		}
		// Only the owner of repeat shard 0 counts; the others say 0, and
		// for a moment around a lease move two may count: the largest is
		// the count.
		if a := b.Alarms; a != nil {
			if f.alarms == nil {
				f.alarms = &alarmCounts{}
			}
			f.alarms.Active = max(f.alarms.Active, a.Active)
			f.alarms.Acked = max(f.alarms.Acked, a.Acked)
			f.alarms.Flapping = max(f.alarms.Flapping, a.Flapping)
		}
	}
	sort.Slice(f.procs, func(i, j int) bool { return f.procs[i].Name < f.procs[j].Name })
	slices.Sort(f.brokerDown)
	f.lag = quantiles(lag)
	return f, nil
}

// quantiles reads p50 and p99 from lag, the sum of every scanner's
// cumulative bucket counts: summing buckets merges histograms exactly, so
// these are the quantiles of the whole fleet's lost events (interpolated
// within a bucket as Prometheus's histogram_quantile does), not an average
// of each scanner's.
func quantiles(lag map[float64]uint64) lagView {
	les := make([]float64, 0, len(lag))
	for le := range lag {
		les = append(les, le)
	}
	slices.Sort(les)
	if len(les) == 0 || lag[les[len(les)-1]] == 0 {
		return lagView{}
	}
	total := lag[les[len(les)-1]]
	q := func(q float64) *float64 {
		rank := q * float64(total)
		lo, below := 0.0, uint64(0)
		for _, le := range les {
			c := lag[le]
			if float64(c) >= rank {
				if math.IsInf(le, 1) {
					// Above the last finite bucket: its bound is all we know.
					le = lo
				} else if c > below {
					le = lo + (le-lo)*(rank-float64(below))/float64(c-below)
				}
				v := math.Round(le*1e4) / 10 // ms, to 0.1
				return &v
			}
			lo, below = le, c
		}
		return nil
	}
	return lagView{P50: q(0.5), P99: q(0.99), Count: int64(total)}
}

// historyLoop adds a point to the history every second from the reports
// alone, until ctx is done.
func (s *fleetStats) historyLoop(ctx context.Context) error {
	periodic.Run(ctx, time.Second, func(time.Time) {
		now := s.now()
		f, err := s.readReports(ctx, now)
		if err != nil {
			return
		}
		s.histMu.Lock()
		defer s.histMu.Unlock()
		s.history = append(s.history, historyPoint{At: now.UnixMilli(), P50: f.lag.P50, P99: f.lag.P99,
			SignalsPerSec: round1(f.signalsPerSec), LostPerSec: round1(f.lostPerSec)})
		if len(s.history) > historyLen {
			s.history = slices.Delete(s.history, 0, len(s.history)-historyLen)
		}
	})
	return nil
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

// get returns the stats, computed at most once per statsCacheFor.
func (s *fleetStats) get(ctx context.Context) (statsView, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.cachedAt.IsZero() && time.Since(s.cachedAt) < statsCacheFor {
		return s.cached, nil
	}
	v, err := s.compute(ctx)
	if err != nil {
		return statsView{}, err
	}
	s.cached, s.cachedAt = v, time.Now()
	return v, nil
}

func (s *fleetStats) compute(ctx context.Context) (statsView, error) {
	now := s.now()
	v := statsView{At: now.UnixMilli()}
	t, err := s.store.Topology(ctx)
	if err != nil {
		return v, err
	}
	v.Shards = topView{Count: t.Shards, Prev: t.Prev, Epoch: t.Epoch, Draining: t.Draining()}
	if v.Shards.Drain, err = drainStatus(ctx, s.store, t, now); err != nil {
		return v, err
	}
	if v.Watched, v.Lost, err = s.store.Fleet(ctx, t.Shards); err != nil {
		return v, err
	}
	wm, n, outs, err := s.store.Watermarks().Tail(ctx, lastOutages)
	if err != nil {
		return v, err
	}
	v.Watermark = wmView{At: wm, OutagesTotal: n, Outages: outs}
	if wm > 0 {
		v.Watermark.AgeMS = max(now.UnixMilli()-wm, 0)
		v.Watermark.Outage = v.Watermark.AgeMS > s.outageAfter.Milliseconds()
	}
	if k := len(outs); k > 0 && outs[k-1].GraceFrom > 0 && outs[k-1].End > now.UnixMilli() {
		v.Watermark.GraceUntil = outs[k-1].End
	}
	f, err := s.readReports(ctx, now)
	if err != nil {
		return v, err
	}
	v.Watermark.BrokerDown = f.brokerDown
	v.Watermark.Outage = v.Watermark.Outage || len(f.brokerDown) > 0
	v.SignalsPerSec, v.LostPerSec = round1(f.signalsPerSec), round1(f.lostPerSec)
	v.LastMinute, v.FireLag, v.Processes = f.minute, f.lag, f.procs
	if f.alarms != nil {
		v.Alarms = &alarmsView{alarmCounts: *f.alarms}
		if s.alarms != nil {
			ms, err := s.alarms.Mutes(ctx)
			if err != nil {
				return v, err
			}
			v.Alarms.Mutes = int64(len(ms))
		}
	}
	s.histMu.Lock()
	v.History = slices.Clone(s.history)
	s.histMu.Unlock()
	if v.History == nil {
		v.History = []historyPoint{}
	}
	return v, nil
}

// getStats is GET /v1/stats.
func (a *App) getStats(w http.ResponseWriter, r *http.Request) {
	v, err := a.stats.get(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// cmdStats shows the fleet's counters through the HTTP API:
// sigwatch stats [--api URL] [--json].
func cmdStats(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	api, token := apiFlags(fs)
	asJSON := fs.Bool("json", false, "print the JSON of GET /v1/stats")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("usage: sigwatch stats [--api URL] [--json]")
	}
	var out strings.Builder
	if err := callAPI(ctx, http.MethodGet, *api+"/v1/stats", *token, nil, &out); err != nil {
		return err
	}
	if *asJSON {
		_, err := io.WriteString(stdout, out.String())
		return err
	}
	var v statsView
	if err := json.Unmarshal([]byte(out.String()), &v); err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	printStats(stdout, v)
	return nil
}

// printStats writes the human form of v.
func printStats(w io.Writer, v statsView) {
	ms := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%.0fms", *p)
	}
	fmt.Fprintf(w, "watched %d  lost %d\n", v.Watched, v.Lost)
	if a := v.Alarms; a != nil {
		fmt.Fprintf(w, "alarms: active %d  acked %d  flapping %d  mutes %d\n", a.Active, a.Acked, a.Flapping, a.Mutes)
	}
	fmt.Fprintf(w, "signals %.1f/s  lost %.1f/s\n", v.SignalsPerSec, v.LostPerSec)
	m := v.LastMinute
	fmt.Fprintf(w, "last minute: signals %d  lost %d  recovered %d  invalid %d\n", m.Signals, m.Lost, m.Recovered, m.Invalid)
	fmt.Fprintf(w, "fire lag (last minute, %d events): p50 %s  p99 %s\n", v.FireLag.Count, ms(v.FireLag.P50), ms(v.FireLag.P99))
	wm := v.Watermark
	switch {
	case wm.At == 0:
		fmt.Fprintln(w, "watermark: none (ingest never ran)")
	case wm.Outage:
		fmt.Fprintf(w, "watermark: %dms old: OUTAGE in progress (nothing is declared lost for silence inside it)\n", wm.AgeMS)
	default:
		fmt.Fprintf(w, "watermark: %dms old\n", wm.AgeMS)
	}
	if len(wm.BrokerDown) > 0 {
		fmt.Fprintf(w, "MQTT broker connection lost: %s\n", strings.Join(wm.BrokerDown, ", "))
	}
	if wm.GraceUntil > 0 {
		fmt.Fprintf(w, "reconnect grace after a broker restart until %s\n", time.UnixMilli(wm.GraceUntil).UTC().Format(time.RFC3339))
	}
	if len(wm.Outages) > 0 {
		fmt.Fprintf(w, "outages: %d recorded, the latest:", wm.OutagesTotal)
		for _, o := range wm.Outages {
			fmt.Fprintf(w, " %s (%s", time.UnixMilli(o.Start).UTC().Format(time.RFC3339), time.Duration(o.End-o.Start)*time.Millisecond)
			if o.GraceFrom > 0 {
				fmt.Fprintf(w, ", %s of it reconnect grace", time.Duration(o.End-o.GraceFrom)*time.Millisecond)
			}
			fmt.Fprint(w, ")")
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "shards %d  prev %d  epoch %d\n", v.Shards.Count, v.Shards.Prev, v.Shards.Epoch)
	if d := v.Shards.Drain; v.Shards.Draining {
		fmt.Fprintf(w, "doubling %d -> %d draining: %d moved devices left; %d of %d old shards drained, %d not checked yet\n",
			d.From, d.To, d.MovedLeft, d.ShardsDrained, d.From, d.ShardsUnchecked)
	}
	for _, p := range v.Processes {
		fmt.Fprintf(w, "process %s: %s, reported %dms ago\n", p.Name, strings.Join(p.Roles, ","), p.AgeMS)
	}
}
