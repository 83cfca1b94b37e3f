package stats

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

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
	// ReportEvery is how often each process reports.
	ReportEvery = time.Second
	// ReportMaxAge is how old a report may be before its process counts as
	// gone; it is also how long the HASH lives after the last report.
	ReportMaxAge = 10 * time.Second
	// rateWindow is the span signals/s and lost/s are measured over: short
	// enough to follow a change within seconds, long enough to smooth the
	// batches ingest and the scanners work in.
	rateWindow = 5 * time.Second
	// CacheFor is how long one computation of the stats answers every
	// request: a status page polling every second from many browsers costs
	// Redis one computation per second per process.
	CacheFor = time.Second
	// historyLen is the number of one-second points of the fire-lag chart.
	historyLen = 60
	// lastOutages is how many of the latest outages the stats show.
	lastOutages = 5
)

// Options are what Fleet reads and where it reports.
type Options struct {
	// Name is this process's name among the reports; Roles are its roles.
	Name  string
	Roles []string
	// History keeps the one-second history GET /v1/stats shows (processes
	// with the api role).
	History  bool
	Store    *shard.Store
	Gatherer prometheus.Gatherer
	Now      func() time.Time
	// Mutes counts the mutes in force (nil without alarms, NATS core mode).
	Mutes func(ctx context.Context) (int, error)
	// OutageAfter is ingest.outage_after: a watermark older is an outage.
	OutageAfter time.Duration
	Log         *slog.Logger
}

// Fleet reports this process's counts and, with History, computes the
// fleet's stats and keeps their history.
type Fleet struct {
	opts    Options
	reports Reports

	// ring holds the samples of the last minute, oldest first; only the
	// report loop touches it.
	ring []sample

	mu       sync.Mutex // serialises computations; guards cached and cachedAt
	cached   View
	cachedAt time.Time

	histMu  sync.Mutex
	history []Point
}

// New returns the stats of one process; Run reports them.
func New(opts Options) *Fleet {
	opts.Roles = slices.Sorted(slices.Values(opts.Roles))
	return &Fleet{opts: opts, reports: NewReports(opts.Store)}
}

// Run reports every second and, with History, adds a point to the history
// every second, until ctx is done.
func (s *Fleet) Run(ctx context.Context) error {
	var g errgroup.Group
	g.Go(func() error { s.reportLoop(ctx); return nil })
	if s.opts.History {
		g.Go(func() error { s.historyLoop(ctx); return nil })
	}
	return g.Wait()
}

// reportLoop reports every ReportEvery until ctx is done, then withdraws
// the report so that a process stopped on purpose drops out at once.
func (s *Fleet) reportLoop(ctx context.Context) {
	s.report(ctx)
	periodic.Run(ctx, ReportEvery, func(time.Time) { s.report(ctx) })
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := s.reports.Delete(uctx, s.opts.Name); err != nil {
		s.opts.Log.Debug("withdrawing the report failed", "err", err)
	}
}

func (s *Fleet) report(ctx context.Context) {
	mfs, err := s.opts.Gatherer.Gather()
	if err != nil {
		s.opts.Log.Warn("gathering metrics for the report failed", "err", err)
		return
	}
	now := s.opts.Now()
	s.ring = append(s.ring, readSample(now, mfs))
	for len(s.ring) > 1 && now.Sub(s.ring[1].at) >= time.Minute {
		s.ring = s.ring[1:]
	}
	body, err := json.Marshal(s.body())
	if err != nil {
		return
	}
	if err := s.reports.Put(ctx, s.opts.Name, Report{At: now.UnixMilli(), Body: string(body)}, ReportMaxAge); err != nil && ctx.Err() == nil {
		s.opts.Log.Warn("report failed", "err", err)
	}
}

// procReport is the body of one process's report.
type procReport struct {
	Roles []string `json:"roles"`
	// SpanMS is what Minute covers: a minute, less just after start.
	SpanMS int64  `json:"span_ms"`
	Minute Counts `json:"minute"`
	// RecentSpanMS is what Recent covers, about rateWindow.
	RecentSpanMS int64  `json:"recent_span_ms"`
	Recent       Counts `json:"recent"`
	// FireLag is the fire-lag histogram over Minute's span: cumulative
	// counts by upper bound in seconds ("+Inf" for the last).
	FireLag map[string]uint64 `json:"fire_lag,omitempty"`
	// Alarms is present on processes that run the alarm role; only the one
	// that owns repeat shard 0 counts, the others say 0.
	Alarms *AlarmCounts `json:"alarms,omitempty"`
	// BrokerDown says the process runs ingest and its connection to the
	// MQTT broker is down: an outage in progress, however short.
	BrokerDown bool `json:"broker_down,omitempty"`
}

// body is the report of the samples in the ring.
func (s *Fleet) body() procReport {
	last, first := s.ring[len(s.ring)-1], s.ring[0]
	recent := first
	for _, x := range slices.Backward(s.ring) {
		recent = x
		if last.at.Sub(x.at) >= rateWindow {
			break
		}
	}
	r := procReport{Roles: s.opts.Roles, SpanMS: last.at.Sub(first.at).Milliseconds(), Minute: last.counts.minus(first.counts),
		RecentSpanMS: last.at.Sub(recent.at).Milliseconds(), Recent: last.counts.minus(recent.counts)}
	if len(last.lag) > 0 {
		r.FireLag = make(map[string]uint64, len(last.lag))
		for le, c := range last.lag {
			r.FireLag[leString(le)] = c - first.lag[le]
		}
	}
	if slices.Contains(s.opts.Roles, "alarm") {
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
