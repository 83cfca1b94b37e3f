package scanner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
)

// Options configure a Scanner. Zero values select the defaults given.
type Options struct {
	// Replica names this process among the scanners; it must be unique,
	// e.g. host-pid-random.
	Replica string
	// Config is the scanner section (lease time, poll bound, claim limit);
	// a zero field takes queue.DefaultConfig's.
	queue.Config
	// Rebalance is the period of the membership heartbeat and of lease
	// acquisition and release, default 500ms.
	Rebalance time.Duration
	// Thresholds gives each device's threshold, to compute last_seen and
	// apply the outage rule. Required.
	Thresholds *shard.Thresholds
	// Now is the clock, default time.Now.
	Now func() time.Time
	// DrainCheck is the period of the drain duties while a doubling drains
	// (see queue.Options.DrainCheck), default 5s.
	DrainCheck time.Duration
}

// Scanner fires the expired deadlines of the shards it owns as lost events.
type Scanner struct {
	opts Options
	eng  *queue.Engine
	m    *metrics
	h    *lost

	// afterPublish, when set by a test, runs between the publishing of a
	// claimed batch and its settling, so a test can land a reset there.
	afterPublish func(i int)
	// killed, set by a test before it cancels Run, makes the replica die as
	// if killed: loops stop at once, no lease is released, the membership is
	// not left.
	killed atomic.Bool
}

// New returns a scanner of the deadlines of store, whose topology topo
// watches, publishing through pub. reg may be nil (metrics are then not
// exported).
func New(opts Options, store *shard.Store, topo *shard.Watcher, pub *dispatch.Bus, reg prometheus.Registerer, log *slog.Logger) (*Scanner, error) {
	switch {
	case pub == nil:
		return nil, errors.New("scanner: a publisher is required")
	case opts.Thresholds == nil:
		return nil, errors.New("scanner: Options.Thresholds is required to compute last_seen and apply the outage rule")
	}
	reg = cmp.Or(reg, prometheus.Registerer(prometheus.NewRegistry()))
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	h := &lost{store: store, pub: pub, thr: opts.Thresholds, m: m,
		log: cmp.Or(log, slog.New(slog.DiscardHandler)), replica: opts.Replica}
	s := &Scanner{opts: opts, m: m, h: h}
	s.eng, err = queue.New(queue.Options{
		Replica: opts.Replica, Family: shard.Deadlines, Name: family,
		Config: opts.Config, Rebalance: opts.Rebalance,
		Now: opts.Now, DrainCheck: opts.DrainCheck, Fencer: h,
		AfterFire: func(i int) {
			if s.afterPublish != nil {
				s.afterPublish(i)
			}
		},
		Killed: s.killed.Load,
	}, store, topo, h, reg, log)
	if err != nil {
		return nil, fmt.Errorf("scanner: %w", err)
	}
	return s, nil
}

// Owned returns the shards whose lease this replica holds, sorted. A shard
// being released stays in the list until its in-flight batch is done.
func (s *Scanner) Owned() []int { return s.eng.Owned() }

// Run scans until ctx is done. On shutdown every shard loop finishes its
// in-flight batch, its lease is released, and the replica leaves the
// membership; then Run returns nil. Run may be called once.
func (s *Scanner) Run(ctx context.Context) error { return s.eng.Run(ctx) }
