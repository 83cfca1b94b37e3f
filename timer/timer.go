package timer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
)

// Options configure a Service.
type Options struct {
	// Replica names this process among the engines firing timers; needed
	// with Fire.
	Replica string
	// Fire runs the engine: this process fires due timers (the scanner
	// role).
	Fire bool
	// Config is the timers section. Its NATS says resets also come over
	// NATS (sigwatch.timers.set.<queue>, JetStream): firing then waits for
	// the resets published before a deadline to be stored. Zero Fetch and
	// AckWait select DefaultConfig's.
	Config
	// Consume makes this process store the resets from NATS (the ingest
	// role).
	Consume bool

	// Engine is the firing engine's settings (the scanner section: a zero
	// field takes queue.DefaultConfig's); DrainCheck, see queue.Options.
	Engine     queue.Config
	DrainCheck time.Duration
	Now        func() time.Time
	Limits     Limits
	// FireStore, if set, is the Redis connection the engine fires on
	// (claims, payload reads, settles), apart from the one resets are
	// written on, so that firing does not queue behind large writes.
	FireStore *shard.Store
	// Journal, if set, is where the timers of durable queues are journalled
	// before a reset or cancel is acknowledged (see journal.go).
	Journal *dispatch.TimerJournal

	// firing, in tests, runs in Fire between reading the firing timers'
	// payloads and publishing their events.
	firing func()
}

// Service is the generic timers of one process: resets from the API and
// NATS, and, with Fire, the engine that fires them.
type Service struct {
	opts   Options
	store  *shard.Store
	fires  *shard.Store // the engine's connection (Options.FireStore or store)
	topo   *shard.Watcher
	pub    *dispatch.Bus
	writer *shard.Writer
	eng    *queue.Engine
	// wm is the store of the timers' watermark, apart from the devices'
	// ingest watermark: the time up to which every reset published over
	// NATS is stored.
	wm  *shard.Store
	m   *metrics
	log *slog.Logger
	// beforeJournal, if set, is called with the states of each write
	// once Redis stored them, before they are journalled (tests).
	beforeJournal func([]dispatch.TimerState)
}

// New returns the timer service of a process. store is the deadlines'
// store (the timers share its shards), topo its topology watcher.
func New(opts Options, store *shard.Store, topo *shard.Watcher, pub *dispatch.Bus, reg prometheus.Registerer, log *slog.Logger) (*Service, error) {
	if store == nil || topo == nil || pub == nil {
		return nil, errors.New("timer: a store, a topology watcher and a publisher are required")
	}
	if opts.NATS && pub.Mode() != dispatch.JetStream {
		return nil, fmt.Errorf("timer: timers.nats: %w", dispatch.ErrNoJetStream)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	d := DefaultConfig()
	opts.Fetch = cmp.Or(max(opts.Fetch, 0), d.Fetch)
	opts.AckWait = cmp.Or(max(opts.AckWait, 0), d.AckWait)
	opts.Limits = opts.Limits.withDefaults()
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	reg = cmp.Or(reg, prometheus.Registerer(prometheus.NewRegistry()))
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	fires := cmp.Or(opts.FireStore, store)
	s := &Service{opts: opts, store: store, fires: fires, topo: topo, pub: pub, wm: fires.Sub("timer"), m: m, log: log}
	name := "timers-" + cmp.Or(opts.Replica, fmt.Sprintf("%p", s))
	s.writer = shard.NewWriter(store, name, topo.Current, topo.Refresh)
	if opts.Fire {
		h := &fire{svc: s}
		s.eng, err = queue.New(queue.Options{
			Replica: opts.Replica, Family: shard.Timers, Name: family, Config: opts.Engine,
			DrainCheck: opts.DrainCheck, Now: opts.Now, Watermark: s.wm, Fencer: h,
		}, fires.Leases("timers"), topo, h, reg, log)
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

// family is the timers' name in the engine's metrics and in their fences.
const family = "timers"

// Run runs what the options ask for until ctx is done: the writer's epoch
// report (resets are written here), the engine and the timers' watermark
// (Fire), the NATS consumer (Consume).
func (s *Service) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		once sync.Once
		ferr error
	)
	run := func(f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil && ctx.Err() == nil {
				once.Do(func() { ferr = err })
				cancel()
			}
		})
	}
	run(func(ctx context.Context) error { s.writer.Run(ctx, s.opts.Now, s.log); return nil })
	if s.eng != nil {
		run(s.advanceWatermark)
		run(s.eng.Run)
		run(s.moveLongTimers)
	}
	if s.opts.NATS && s.opts.Consume {
		run(s.consume)
		run(s.serveRequests)
	}
	wg.Wait()
	return ferr
}

// Reset stores resets, received at the same moment, as one batch.
func (s *Service) Reset(ctx context.Context, rs []shard.TimerReset) error {
	if len(rs) == 0 {
		return nil
	}
	if err := s.resetJournalled(ctx, rs); err != nil {
		return fmt.Errorf("timer: reset: %w", err)
	}
	return nil
}

// Get returns timer id of queue, and false if there is none.
func (s *Service) Get(ctx context.Context, queue, id string) (Timer, bool, error) {
	if err := CheckQueue(queue); err != nil {
		return Timer{}, false, err
	}
	t, ok, err := s.store.Timers().Get(ctx, shard.TimerMember(queue, id))
	if err != nil || !ok {
		return Timer{}, false, err
	}
	return Timer{Queue: queue, ID: id, Deadline: t.Deadline, Payload: t.Payload}, true, nil
}

// Cancel removes timer id of queue so that it never fires, and reports
// whether there was one. A timer already due may be firing at that moment.
func (s *Service) Cancel(ctx context.Context, queue, id string) (bool, error) {
	if err := CheckQueue(queue); err != nil {
		return false, err
	}
	return s.cancelJournalled(ctx, queue, id)
}

// Limits returns the bounds a reset must keep.
func (s *Service) Limits() Limits { return s.opts.Limits }

// Now is the service's clock.
func (s *Service) Now() time.Time { return s.opts.Now() }

// Owned returns the shards whose timers this process fires.
func (s *Service) Owned() []int {
	if s.eng == nil {
		return nil
	}
	return s.eng.Owned()
}
