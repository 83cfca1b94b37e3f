package queue

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/internal/ratelog"
	"github.com/sigwatch/sigwatch/shard"
)

// Batch is one claimed batch of due entries of a shard, as a Handler gets it.
type Batch struct {
	Shard int
	// Due are the claimed entries, earliest first, after the crossing rule
	// dropped stale copies.
	Due []shard.Entry
	// Now is the claim time.
	Now time.Time
	// Outages are the ingest outages recorded with the watermark that
	// bounded the claim (never older than it).
	Outages []shard.Outage
	// Fence is what Options.Fencer returned when this replica took the
	// shard's lease (0 without a Fencer). The handler publishes under it, so
	// that nothing it publishes is stored once another replica has taken
	// the shard.
	Fence uint64
	// Moving says a doubling drains (or is being published) across this
	// shard: an entry fired now may have a copy in its partner shard,
	// which the crossing rule checks against Handler.Fired.
	Moving bool

	held func() bool
}

// Held reports whether this replica surely still holds the shard's lease,
// by its own monotonic clock: the lease's last renewal has not run out. A
// handler checks it before an effect the lease cannot fence (a lost mark
// in another slot), so that a replica resumed from a long pause does no
// such thing; the pause may still fall just after the check, which the
// handler's undo covers.
func (b Batch) Held() bool { return b.held == nil || b.held() }

// Fencer fences a shard outside Redis when a replica takes its lease: once
// Fence has returned, the publishes of every earlier owner of the shard
// are refused wherever they land, however long that owner was paused.
type Fencer interface {
	Fence(ctx context.Context, lease shard.Lease) (uint64, error)
}

// ErrFenced is returned (wrapped) by a Handler whose publish was refused
// because another replica has fenced the shard since: the lease is lost.
// The engine settles nothing of the batch and stops the shard's loop.
var ErrFenced = errors.New("queue: fenced out: another replica has taken the shard")

// Handler is a timer family's policy: what firing a due entry means.
type Handler interface {
	// Fire handles the due entries of a batch. It returns the entries it
	// handled (they are compare-and-removed) and moves (deferrals, applied
	// only if the score is unchanged). Entries in neither stay and are
	// claimed again after a backoff; err says why.
	Fire(ctx context.Context, b Batch) (handled []shard.Entry, moves []shard.Move, err error)
	// Fired returns, for each id, the latest score at which one of its
	// entries was already handled (0 if never). While a doubling drains, a
	// moved entry whose partner copy is gone fires only if Fired says it has
	// not already fired at its score or later.
	Fired(ctx context.Context, ids []string) ([]int64, error)
	// Revived is told of an entry it handled (fired, at its claimed score)
	// that a reset revived between claim and settle: it stays in its shard
	// at revived.Deadline. An error fails the step; the entry is not offered
	// again.
	Revived(ctx context.Context, fired, revived shard.Entry) error
}

// Options configure an Engine.
type Options struct {
	// Replica names this process among the engines of the family; it must
	// be unique, e.g. host-pid-random.
	Replica string
	// Family is the timer family run. Required.
	Family shard.Family
	// Name is the family's name in the metrics' family label, default
	// string(Family).
	Name string
	// Config is the scanner section: the lease time (leases are renewed
	// every LeaseTTL/3), the poll bound and the claim limit; a zero field
	// takes DefaultConfig's. A shard with nothing due sleeps until its head
	// is due, and a write that lands earlier wakes it at once
	// (shard.Store.Wakes), so Poll only matters for a wake notice lost
	// without the subscription breaking.
	Config
	// Rebalance is the period of the membership heartbeat and of lease
	// acquisition and release, default 500ms.
	Rebalance time.Duration
	// Now is the clock, default time.Now.
	Now func() time.Time
	// Watermark is the store whose ingest watermark bounds claims, default
	// the engine's own store. An engine of another queue (the alarm's repeat
	// timers) passes the deadline store: it fires only up to where ingest is
	// known to have been consuming.
	Watermark *shard.Store
	// DrainCheck is the period of the drain duties while a doubling drains:
	// raising the floors of the old shards this replica owns, counting their
	// moved members (a full ZSCAN of each), and, for the owner of shard 0,
	// ending the doubling. Default 5s.
	DrainCheck time.Duration

	// Fencer, if set, fences each shard when its lease is taken, before
	// anything of the shard is claimed; its value reaches the handler in
	// Batch.Fence.
	Fencer Fencer

	// AfterFire, a test seam, runs between the handler's Fire and the
	// settle of its batch, so that a test can land a reset there.
	AfterFire func(shard int)
	// Killed, a test seam, is asked when Run's ctx is done: true makes the
	// replica die as if killed (loops stop at once, no lease is released,
	// the membership is not left).
	Killed func() bool
}

// DefaultPoll is the default Options.Poll. A shard with nothing due for
// longer costs one claim per poll, so an idle installation of 1,024 shards
// costs about a hundred small scripts a second per family.
const DefaultPoll = 10 * time.Second

// watermarkEvery is how often the engine reads the ingest watermark while a
// loop waits for it (at most half a poll), besides at once when a rise is
// announced: one small round trip per period for the whole replica, however
// many shards it owns. watermarkAge is how
// old a read may be when a step takes it: an older watermark only holds
// firing back, and a loop with something due by the clock waits for the
// refresher, which reads every watermarkEvery, so a sleeping shard that
// wakes for a check costs no read of its own. watermarkHold is how long a
// loop waits for a later watermark before it looks again by itself.
const (
	watermarkEvery = 5 * time.Millisecond
	watermarkAge   = 250 * time.Millisecond
	watermarkHold  = time.Second
)

// sizeEvery is the period of the shard_size gauge update.
const sizeEvery = 5 * time.Second

func (o *Options) defaults() {
	o.Name = cmp.Or(o.Name, string(o.Family))
	d := DefaultConfig()
	o.LeaseTTL = cmp.Or(max(o.LeaseTTL, 0), d.LeaseTTL)
	o.Rebalance = cmp.Or(max(o.Rebalance, 0), defaultRebalance)
	o.Poll = cmp.Or(max(o.Poll, 0), d.Poll)
	o.Batch = cmp.Or(max(o.Batch, 0), d.Batch)
	o.DrainCheck = cmp.Or(max(o.DrainCheck, 0), defaultDrainCheck)
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Engine fires the due timers of the shards it owns through its handler.
type Engine struct {
	opts  Options
	store *shard.Store
	topo  *shard.Watcher
	h     Handler
	log   *slog.Logger
	warn  *ratelog.Limiter // one line per second per kind of failure
	m     *metrics
	wm    *watermark

	running atomic.Bool
	mu      sync.Mutex
	loops   map[int]*shardLoop // held leases and their loops, guarded by mu
}

// New returns an engine running opts.Family of store, whose topology topo
// watches, with h as its policy. reg may be nil (metrics are then not
// exported).
func New(opts Options, store *shard.Store, topo *shard.Watcher, h Handler, reg prometheus.Registerer, log *slog.Logger) (*Engine, error) {
	opts.defaults()
	switch {
	case opts.Replica == "":
		return nil, errors.New("queue: Options.Replica is empty: give each process a unique replica id")
	case opts.Family == "":
		return nil, errors.New("queue: Options.Family is empty")
	case store == nil || topo == nil || h == nil:
		return nil, errors.New("queue: a store, a topology watcher and a handler are required")
	}
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	m, err := newMetrics(cmp.Or(reg, prometheus.Registerer(prometheus.NewRegistry())), opts.Name)
	if err != nil {
		return nil, err
	}
	return &Engine{
		opts:  opts,
		store: store,
		topo:  topo,
		h:     h,
		log:   log,
		warn:  ratelog.New(time.Second, nil),
		m:     m,
		wm: newWatermark(cmp.Or(opts.Watermark, store), min(watermarkAge, opts.Poll), min(watermarkEvery, opts.Poll/2),
			min(watermarkHold, opts.Poll)),
		loops: make(map[int]*shardLoop),
	}, nil
}

// Owned returns the shards whose lease this replica holds, sorted. A shard
// being released stays in the list until its in-flight batch is done.
func (e *Engine) Owned() []int {
	e.mu.Lock()
	out := make([]int, 0, len(e.loops))
	for i := range e.loops {
		out = append(out, i)
	}
	e.mu.Unlock()
	slices.Sort(out)
	return out
}

// wakeShard ends the sleep of shard i's loop, if this replica runs it: a
// write landed earlier than the loop's head.
func (e *Engine) wakeShard(i int) {
	e.mu.Lock()
	l := e.loops[i]
	e.mu.Unlock()
	if l != nil {
		e.m.wakes.WithLabelValues("write").Inc()
		l.wake()
	}
}

// wakeAll ends the sleep of every loop: the wake subscription was
// (re)established, and notices sent while it was down are lost.
func (e *Engine) wakeAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, l := range e.loops {
		l.wake()
	}
	e.m.wakes.WithLabelValues("subscribed").Add(float64(len(e.loops)))
}

// WatermarkWanted reports whether one of the engine's loops has something
// due by the clock that waits for a later watermark. Whoever advances the
// watermark (the timers' own) can then do it often only while it matters.
func (e *Engine) WatermarkWanted() bool { return e.wm.wanted() }

// killed reports whether the Killed seam says the replica dies.
func (e *Engine) killed() bool { return e.opts.Killed != nil && e.opts.Killed() }

// Run fires timers until ctx is done. On shutdown every shard loop finishes
// its in-flight batch, its lease is released, and the replica leaves the
// membership; then Run returns nil. Run may be called once.
func (e *Engine) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return errors.New("queue: Run called twice")
	}
	// Shard loops run on loopCtx, which outlives ctx so that an in-flight
	// batch can be fired and settled after shutdown begins. cancelLoops is
	// the hard stop.
	loopCtx, cancelLoops := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	// The watermark refresher serves the loops, so it lives as long as they
	// may: it stops after them, when Run returns.
	refreshed := make(chan struct{})
	go func() {
		defer close(refreshed)
		e.wm.run(loopCtx)
	}()
	// Wake notices end the sleep of idle loops, and announced rises of
	// the watermark the wait of loops held back by it; they too outlive ctx.
	subscribed, moves := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(subscribed)
		e.store.Wakes(loopCtx, e.opts.Family, e.wakeAll, e.wakeShard)
	}()
	go func() {
		defer close(moves)
		e.wm.store.Watermarks().Moves(loopCtx, e.wm.notify, e.wm.notify)
	}()
	defer func() {
		cancelLoops()
		<-refreshed
		<-subscribed
		<-moves
	}()

	rebalance := time.NewTicker(e.opts.Rebalance)
	defer rebalance.Stop()
	renew := time.NewTicker(e.opts.LeaseTTL / 3)
	defer renew.Stop()
	sizes := time.NewTicker(sizeEvery)
	defer sizes.Stop()

	// The drainer runs on ctx: its duties are idempotent, so it stops at
	// once on shutdown, before the loops do.
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		e.drain(ctx)
	}()

	e.rebalance(ctx, loopCtx, &wg)
	for {
		select {
		case <-ctx.Done():
			<-drained
			if e.killed() {
				cancelLoops()
				wg.Wait()
				return nil
			}
			e.shutdown(loopCtx, cancelLoops, &wg, renew.C)
			return nil
		case <-rebalance.C:
			e.rebalance(ctx, loopCtx, &wg)
		case <-renew.C:
			e.renew(ctx)
		case <-sizes.C:
			e.updateSizes(ctx)
		}
	}
}
