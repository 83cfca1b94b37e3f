package stats

import (
	"context"
	"slices"
	"time"

	"github.com/sigwatch/sigwatch/internal/periodic"
	"github.com/sigwatch/sigwatch/shard"
)

// View is the fleet's stats, the body of GET /v1/stats.
type View struct {
	// At is when the stats were computed (Redis time, unix ms).
	At int64 `json:"at"`
	// Watched devices have a deadline; Lost ones are lost now. During a
	// doubling Watched may count a moved device twice until its old copy
	// drains (at most Shards.Drain.MovedLeft more).
	Watched int64 `json:"watched"`
	Lost    int64 `json:"lost"`
	// Alarms is null when no process runs the alarm role.
	Alarms *Alarms `json:"alarms"`
	// SignalsPerSec and LostPerSec are measured over the last few seconds.
	SignalsPerSec float64   `json:"signals_per_sec"`
	LostPerSec    float64   `json:"lost_per_sec"`
	LastMinute    Counts    `json:"last_minute"`
	FireLag       Lag       `json:"fire_lag"`
	Watermark     Watermark `json:"watermark"`
	Shards        Shards    `json:"shards"`
	// Processes are those whose report is fresh, by name.
	Processes []Process `json:"processes"`
	// History is the last minute, one point a second, oldest first.
	History []Point `json:"history"`
}

// Alarms counts the open alarms by state, and the mutes in force.
type Alarms struct {
	AlarmCounts
	Mutes int64 `json:"mutes"`
}

// Lag is the fire lag of the last minute's lost events: quantiles of the
// merged histograms of every scanner, null when nothing fired.
type Lag struct {
	P50   *float64 `json:"p50_ms"`
	P99   *float64 `json:"p99_ms"`
	Count int64    `json:"count"`
}

// Watermark is the ingest watermark against Redis time.
type Watermark struct {
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

// Shards is the topology and the progress of its doubling.
type Shards struct {
	Count    int   `json:"count"`
	Prev     int   `json:"prev"`
	Epoch    int64 `json:"epoch"`
	Draining bool  `json:"draining"`
	Drain    Drain `json:"drain"`
}

// Process is one process whose report is fresh.
type Process struct {
	Name  string   `json:"name"`
	Roles []string `json:"roles"`
	AgeMS int64    `json:"age_ms"`
}

// Point is one second of the fire-lag chart.
type Point struct {
	At            int64    `json:"at"`
	P50           *float64 `json:"p50_ms"`
	P99           *float64 `json:"p99_ms"`
	SignalsPerSec float64  `json:"signals_per_sec"`
	LostPerSec    float64  `json:"lost_per_sec"`
}

// historyLoop adds a point to the history every second from the reports
// alone, until ctx is done.
func (s *Fleet) historyLoop(ctx context.Context) {
	periodic.Run(ctx, time.Second, func(time.Time) {
		now := s.opts.Now()
		f, err := s.readReports(ctx, now)
		if err != nil {
			return
		}
		s.histMu.Lock()
		defer s.histMu.Unlock()
		s.history = append(s.history, Point{At: now.UnixMilli(), P50: f.lag.P50, P99: f.lag.P99,
			SignalsPerSec: round1(f.signalsPerSec), LostPerSec: round1(f.lostPerSec)})
		if len(s.history) > historyLen {
			s.history = slices.Delete(s.history, 0, len(s.history)-historyLen)
		}
	})
}

// Get returns the stats, computed at most once per CacheFor.
func (s *Fleet) Get(ctx context.Context) (View, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.cachedAt.IsZero() && time.Since(s.cachedAt) < CacheFor {
		return s.cached, nil
	}
	v, err := s.compute(ctx)
	if err != nil {
		return View{}, err
	}
	s.cached, s.cachedAt = v, time.Now()
	return v, nil
}

func (s *Fleet) compute(ctx context.Context) (View, error) {
	store, now := s.opts.Store, s.opts.Now()
	v := View{At: now.UnixMilli()}
	t, err := store.Topology(ctx)
	if err != nil {
		return v, err
	}
	v.Shards = Shards{Count: t.Shards, Prev: t.Prev, Epoch: t.Epoch, Draining: t.Draining()}
	if v.Shards.Drain, err = DrainOf(ctx, store, t, now); err != nil {
		return v, err
	}
	if v.Watched, v.Lost, err = store.Fleet(ctx, t.Shards); err != nil {
		return v, err
	}
	wm, n, outs, err := store.Watermarks().Tail(ctx, lastOutages)
	if err != nil {
		return v, err
	}
	v.Watermark = Watermark{At: wm, OutagesTotal: n, Outages: outs}
	if wm > 0 {
		v.Watermark.AgeMS = max(now.UnixMilli()-wm, 0)
		v.Watermark.Outage = v.Watermark.AgeMS > s.opts.OutageAfter.Milliseconds()
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
		v.Alarms = &Alarms{AlarmCounts: *f.alarms}
		if s.opts.Mutes != nil {
			n, err := s.opts.Mutes(ctx)
			if err != nil {
				return v, err
			}
			v.Alarms.Mutes = int64(n)
		}
	}
	s.histMu.Lock()
	v.History = slices.Clone(s.history)
	s.histMu.Unlock()
	if v.History == nil {
		v.History = []Point{}
	}
	return v, nil
}
