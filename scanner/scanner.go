// Package scanner fires expired timers. Each replica owns a share of the
// shards by lease; for every owned shard one loop waits for the shard's head
// deadline, claims a batch of due members, publishes a lost event for each
// and compare-and-removes what was published.
//
// Goroutines and their owners: Run is the coordinator. It heartbeats
// membership, acquires, renews and releases leases, and starts one shard loop
// per held lease. Run owns every shard loop: it asks a loop to stop when its
// shard is no longer desired or on shutdown (the loop finishes its in-flight
// batch, then releases its lease), cancels it when its lease is lost, and
// does not return before every loop has ended. On shutdown the loops stop
// first, then the replica leaves the membership.
package scanner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// FireFunc handles one claimed batch of shard i in place of lost-event
// publishing. due are the claimed entries, now is the claim time. It returns
// the entries it handled (they are compare-and-removed) and moves (deferrals,
// applied only if the score is unchanged). Entries in neither stay and are
// claimed again. Entries a reset revived between claim and settle stay at
// their new score; a FireFunc that needs to know reads the score itself.
type FireFunc func(ctx context.Context, i int, due []shard.Entry, now time.Time) (handled []shard.Entry, moves []shard.Move)

// Options configure a Scanner.
type Options struct {
	// Replica names this process among the scanners; it must be unique,
	// e.g. host-pid-random.
	Replica string
	// Family is the timer family scanned, default shard.Deadlines.
	Family shard.Family
	// LeaseTTL is the lease time of a shard, default 5s. Leases are renewed
	// every LeaseTTL/3; a dead replica's shards move within about LeaseTTL.
	LeaseTTL time.Duration
	// Rebalance is the period of the membership heartbeat and of lease
	// acquisition and release, default 500ms.
	Rebalance time.Duration
	// Poll bounds the wait between two claims of one shard and the age of
	// the watermark read, default DefaultPoll.
	Poll time.Duration
	// Batch is the claim limit, default 256.
	Batch int
	// Thresholds gives each device's threshold, to compute last_seen and
	// apply the outage rule. Required unless Fire is set.
	Thresholds *shard.Thresholds
	// Now is the clock, default time.Now.
	Now func() time.Time
	// Fire, when non-nil, handles each claimed batch instead of the default
	// lost-event publishing (the alarm package uses it for repeat timers).
	// Claims stay bounded by the ingest watermark; the outage rule and
	// recovered events are then Fire's business.
	Fire FireFunc
	// Fired, for a Fire hook that removes the entries it handles, returns
	// for each id the latest score at which one of its entries was already
	// handled (0 if never). While a doubling drains, a moved entry whose
	// partner copy is gone fires only if Fired says it has not already fired
	// at its score or later. The default reads the registry's lost mark for
	// the Deadlines family and reports nothing for the others.
	Fired func(ctx context.Context, ids []string) ([]int64, error)
	// Watermark is the store whose ingest watermark bounds claims, default
	// the scanner's own store. A scanner of another queue (the alarm's
	// repeat timers) passes the deadline store: it fires only up to where
	// ingest is known to have been consuming, so that "has the device
	// signalled again?" is answerable when it fires.
	Watermark *shard.Store
	// DrainCheck is the period of the drain duties while a doubling drains:
	// raising the floors of the old shards this replica owns, counting their
	// moved members (a full ZSCAN of each), and, for the owner of shard 0,
	// ending the doubling. Default 5s.
	DrainCheck time.Duration
}

// DefaultPoll is the default Options.Poll. An idle shard costs one claim
// per poll, so the Redis work of an idle fleet grows with shards / poll; a
// due head that waits for the watermark does not wait for the poll (the
// loop wakes when a later watermark is read).
const DefaultPoll = 20 * time.Millisecond

// watermarkEvery is how often the scanner reads the ingest watermark (at
// most half a poll): one small round trip per period for the whole
// replica, however many shards it owns.
const watermarkEvery = 5 * time.Millisecond

func (o *Options) defaults() {
	if o.Family == "" {
		o.Family = shard.Deadlines
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 5 * time.Second
	}
	if o.Rebalance <= 0 {
		o.Rebalance = 500 * time.Millisecond
	}
	if o.Poll <= 0 {
		o.Poll = DefaultPoll
	}
	if o.Batch <= 0 {
		o.Batch = 256
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.DrainCheck <= 0 {
		o.DrainCheck = 5 * time.Second
	}
}

// sizeEvery is the period of the shard_size gauge update.
const sizeEvery = 5 * time.Second

// Scanner fires the expired timers of the shards it owns.
type Scanner struct {
	opts  Options
	store *shard.Store
	topo  *shard.Watcher
	pub   *dispatch.Publisher
	log   *slog.Logger
	warn  *limitedLog
	m     *metrics
	wm    *watermark

	running atomic.Bool
	mu      sync.Mutex
	loops   map[int]*shardLoop // held leases and their loops, guarded by mu

	// afterPublish, when set by a test, runs between the publishing of a
	// claimed batch and its settling, so a test can land a reset there.
	afterPublish func(i int)
	// killed, set by a test before it cancels Run, makes the replica die as
	// if killed: loops stop at once, no lease is released, the membership is
	// not left.
	killed atomic.Bool
}

// New returns a scanner. pub may be nil only when opts.Fire is set; reg may
// be nil (metrics are then not exported).
func New(opts Options, store *shard.Store, topo *shard.Watcher, pub *dispatch.Publisher, reg prometheus.Registerer, log *slog.Logger) (*Scanner, error) {
	opts.defaults()
	switch {
	case opts.Replica == "":
		return nil, errors.New("scanner: Options.Replica is empty: give each process a unique replica id")
	case store == nil || topo == nil:
		return nil, errors.New("scanner: a store and a topology watcher are required")
	case opts.Fire == nil && pub == nil:
		return nil, errors.New("scanner: a publisher is required unless Options.Fire is set")
	case opts.Fire == nil && opts.Thresholds == nil:
		return nil, errors.New("scanner: Options.Thresholds is required to compute last_seen and apply the outage rule")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Scanner{
		opts:  opts,
		store: store,
		topo:  topo,
		pub:   pub,
		log:   log,
		warn:  newLimitedLog(log, time.Second),
		m:     m,
		wm:    newWatermark(cmp.Or(opts.Watermark, store), opts.Poll, min(watermarkEvery, opts.Poll/2)),
		loops: make(map[int]*shardLoop),
	}, nil
}

// Owned returns the shards whose lease this replica holds, sorted. A shard
// being released stays in the list until its in-flight batch is done.
func (s *Scanner) Owned() []int {
	s.mu.Lock()
	out := make([]int, 0, len(s.loops))
	for i := range s.loops {
		out = append(out, i)
	}
	s.mu.Unlock()
	slices.Sort(out)
	return out
}

// Run scans until ctx is done. On shutdown every shard loop finishes its
// in-flight batch, its lease is released, and the replica leaves the
// membership; then Run returns nil. Run may be called once.
func (s *Scanner) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("scanner: Run called twice")
	}
	// Shard loops run on loopCtx, which outlives ctx so that an in-flight
	// batch can be published and settled after shutdown begins.
	// cancelLoops is the hard stop.
	loopCtx, cancelLoops := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	// The watermark refresher serves the loops, so it lives as long as they
	// may: it stops after them, when Run returns.
	refreshed := make(chan struct{})
	go func() {
		defer close(refreshed)
		s.wm.run(loopCtx)
	}()
	defer func() {
		cancelLoops()
		<-refreshed
	}()

	rebalance := time.NewTicker(s.opts.Rebalance)
	defer rebalance.Stop()
	renew := time.NewTicker(s.opts.LeaseTTL / 3)
	defer renew.Stop()
	sizes := time.NewTicker(sizeEvery)
	defer sizes.Stop()

	// The drainer runs on ctx: its duties are idempotent, so it stops at
	// once on shutdown, before the loops do.
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		s.drain(ctx)
	}()

	s.rebalance(ctx, loopCtx, &wg)
	for {
		select {
		case <-ctx.Done():
			<-drained
			if s.killed.Load() {
				cancelLoops()
				wg.Wait()
				return nil
			}
			s.shutdown(loopCtx, cancelLoops, &wg, renew.C)
			return nil
		case <-rebalance.C:
			s.rebalance(ctx, loopCtx, &wg)
		case <-renew.C:
			s.renew(ctx)
		case <-sizes.C:
			s.updateSizes(ctx)
		}
	}
}

// opTimeout bounds one coordinator call to Redis, so a hung call cannot
// hold up lease renewals for longer than a renewal period.
func (s *Scanner) opTimeout() time.Duration { return s.opts.LeaseTTL / 3 }

// rebalance heartbeats, computes the desired shards, asks loops of shards no
// longer desired to stop, and acquires the desired shards not yet held.
func (s *Scanner) rebalance(ctx, loopCtx context.Context, wg *sync.WaitGroup) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	live, err := s.store.Heartbeat(ctx, s.opts.Replica, s.opts.Now(), s.opts.LeaseTTL)
	if err != nil {
		if ctx.Err() == nil {
			s.warn.Warn("heartbeat", "scanner heartbeat failed; keeping current shards", "err", err)
		}
		return
	}
	slices.Sort(live) // Assign needs the order every replica sees; Heartbeat sorts too.
	desired := shard.Assign(s.topo.Current().Shards, live, s.opts.Replica)

	s.mu.Lock()
	for i, l := range s.loops {
		if !slices.Contains(desired, i) {
			l.requestStop()
		}
	}
	var missing []int
	for _, i := range desired {
		if _, ok := s.loops[i]; !ok {
			missing = append(missing, i)
		}
	}
	s.mu.Unlock()

	leases := make([]*shard.Lease, len(missing))
	parallel(len(missing), func(j int) {
		l, ok, err := s.store.Acquire(ctx, missing[j], s.opts.Replica, s.opts.LeaseTTL)
		if err != nil {
			if ctx.Err() == nil {
				s.warn.Warn("acquire", "lease acquisition failed", "shard", missing[j], "err", err)
			}
			return
		}
		if ok {
			leases[j] = &l
		}
	})
	for _, l := range leases {
		if l != nil {
			s.start(loopCtx, wg, *l)
		}
	}
	s.m.owned.Set(float64(len(s.Owned())))
}

// start runs a shard loop for a freshly acquired lease.
func (s *Scanner) start(loopCtx context.Context, wg *sync.WaitGroup, lease shard.Lease) {
	ctx, cancel := context.WithCancel(loopCtx)
	l := &shardLoop{lease: lease, stop: make(chan struct{}), cancel: cancel}
	s.mu.Lock()
	s.loops[lease.Shard] = l
	s.mu.Unlock()
	s.log.Debug("shard acquired", "shard", lease.Shard, "token", lease.Token())
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cancel()
		s.runShard(ctx, l)
		s.mu.Lock()
		if s.loops[lease.Shard] == l {
			delete(s.loops, lease.Shard)
		}
		s.mu.Unlock()
	}()
}

// renew extends every held lease; a lease found lost stops its loop at once.
func (s *Scanner) renew(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	s.mu.Lock()
	loops := make([]*shardLoop, 0, len(s.loops))
	for _, l := range s.loops {
		loops = append(loops, l)
	}
	s.mu.Unlock()
	parallel(len(loops), func(j int) {
		l := loops[j]
		err := s.store.Renew(ctx, l.lease, s.opts.LeaseTTL)
		switch {
		case errors.Is(err, shard.ErrNotOwner):
			s.leaseLost(l, "renew")
		case err != nil && ctx.Err() == nil:
			s.warn.Warn("renew", "lease renewal failed", "shard", l.lease.Shard, "err", err)
		}
	})
}

// leaseLost stops l at once: another replica may own its shard now.
func (s *Scanner) leaseLost(l *shardLoop, during string) {
	if l.lost.CompareAndSwap(false, true) {
		s.m.leaseLost.Inc()
		s.log.Warn("shard lease lost; stopping its loop", "shard", l.lease.Shard, "during", during)
	}
	l.cancel()
}

// shutdown stops every loop after its in-flight batch, renewing their
// leases meanwhile; loops still busy after a lease time are cancelled (what
// they had not settled stays in Redis and is claimed again). Then the
// replica leaves the membership.
func (s *Scanner) shutdown(loopCtx context.Context, cancelLoops context.CancelFunc, wg *sync.WaitGroup, renew <-chan time.Time) {
	s.mu.Lock()
	for _, l := range s.loops {
		l.requestStop()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { // Ends when the last loop does; cancelLoops below guarantees that.
		wg.Wait()
		close(done)
	}()
	grace := time.NewTimer(s.opts.LeaseTTL)
	defer grace.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-renew:
			s.renew(loopCtx)
		case <-grace.C:
			s.log.Warn("shard loops still busy at shutdown; cancelling them")
			cancelLoops()
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(loopCtx), s.opTimeout())
	defer cancel()
	if err := s.store.Leave(ctx, s.opts.Replica); err != nil {
		s.log.Warn("leaving scanner membership failed; it expires by itself", "err", err)
	}
	s.m.owned.Set(0)
	s.m.shardSize.Reset()
}

// updateSizes refreshes the shard_size gauge of the owned shards.
func (s *Scanner) updateSizes(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	owned := s.Owned()
	sizes := make([]int64, len(owned))
	errs := make([]error, len(owned))
	parallel(len(owned), func(j int) {
		sizes[j], errs[j] = s.store.Size(ctx, s.opts.Family, owned[j])
	})
	s.m.shardSize.Reset()
	for j, i := range owned {
		if errs[j] == nil {
			s.m.shardSize.WithLabelValues(fmt.Sprint(i)).Set(float64(sizes[j]))
		}
	}
}

// parallel calls f(0..n-1) concurrently and waits; rueidis pipelines the
// Redis calls they make.
func parallel(n int, f func(j int)) {
	if n == 1 {
		f(0)
		return
	}
	var wg sync.WaitGroup
	for j := range n {
		wg.Go(func() { f(j) })
	}
	wg.Wait()
}
