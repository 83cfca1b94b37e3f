package ingest

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/ratelog"
	"github.com/sigwatch/sigwatch/shard"
)

// ErrStopped is returned by Signal when ingest has stopped, or stopped
// before the signal was stored.
var ErrStopped = errors.New("ingest: stopped")

// Ingest is the ingest role: its four stages, wired. Build it with New and
// start it with Run.
type Ingest struct {
	opts Options
	log  *slog.Logger
	m    *metrics

	src  *source      // MQTT in → pipe, dead
	pipe *pipeline    // signals → Redis → wm
	wm   *watermark   // barriers and flushes → this member's watermark
	dead *deadLetters // refusals → the dead-letter subject

	started chan struct{} // closed when Run has started the stages
	ran     atomic.Bool
	// drain bounds how long Run, stopping, waits for work in flight to be
	// stored (drainTimeout; tests shorten it).
	drain time.Duration
}

// New checks opts and builds ingest, registering its metrics on reg (which
// may be nil). pub may be nil: recovered and invalid events are then counted
// and logged but not published.
func New(opts Options, store *shard.Store, topo *shard.Watcher, pub *dispatch.Bus, reg prometheus.Registerer, log *slog.Logger) (*Ingest, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if store == nil || topo == nil {
		return nil, errors.New("ingest: a store and a topology watcher are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	in := &Ingest{opts: opts, log: log, started: make(chan struct{}), drain: drainTimeout}
	m := newMetrics(in)
	in.m = m
	o := &in.opts
	br := &breaks{grace: o.ReconnectGrace, m: m}
	in.wm = newWatermark(o, store, br, m, log)
	in.dead = newDeadLetters(pub, m, log)
	// The writer reports the topology epoch ingest writes with, so a
	// doubling's drain knows when no write can land in an old shard.
	name := cmp.Or(opts.Process, opts.ClientID)
	if name == "" {
		name = "ingest-" + nuid.Next()
	}
	in.pipe = &pipeline{
		opts:     o,
		topo:     topo,
		store:    store,
		writer:   shard.NewWriter(store, name, topo.Current, topo.Refresh),
		devices:  shard.NewDevices(store, topo, opts.Thresholds, opts.Now),
		pub:      pub,
		wm:       in.wm,
		log:      log,
		m:        m,
		errLog:   ratelog.New(time.Second, opts.Now),
		slots:    make(chan struct{}, opts.MaxInFlight),
		work:     make(chan signal, 1024),
		stopping: make(chan struct{}),
		beats:    make([]func(), flushers),
	}
	for j := range in.pipe.beats {
		in.pipe.beats[j] = func() {}
		if opts.Beat != nil {
			in.pipe.beats[j] = opts.Beat()
		}
	}
	in.src = newSource(o, in.pipe, in.dead, br, log)
	if opts.SharedGroup != "" {
		in.src.join = in.wm.join
	}
	if err := m.register(reg); err != nil {
		return nil, err
	}
	return in, nil
}

// Run starts the stages, connects to the brokers and subscribes, and runs
// until ctx is done. Stopping, it takes no new messages, stores and acks
// what is in flight (for up to drainTimeout), then disconnects. With no
// Brokers it serves only Signal. Run may be called once; it returns once
// every goroutine it started has ended.
//
// The stages stop senders before receivers: the source first (no more
// messages or probes), then the pipeline drains what is in flight, then
// the watermark stores its last report and the dead letters forward what
// they hold; the connection closes last, after the acks.
//
// A member of a shared group first hands its share of the stream over
// (source.handOver) and waits until everything routed to it is stored;
// only then does it leave the group's watermark. A member that cannot
// (broker or Redis unreachable, drainTimeout passed) stays in the group, so
// the group waits MemberTimeout for it and the gap is recorded as an
// outage: the broker drops what it had routed to a clean session.
// A member with a persistent session leaves what it did not store unacked
// in its session, for the next run.
func (in *Ingest) Run(ctx context.Context) error {
	if !in.ran.CompareAndSwap(false, true) {
		return errors.New("ingest: Run may be called only once")
	}
	in.wm.startedAt.Store(in.opts.Now().UnixMilli())
	// What a session's backlog is judged by, before the first probe is back.
	in.src.seed(ctx, in.pipe.store, in.wm.member)

	// Work in flight is finished with its own context, so that stopping
	// stores and acks it instead of abandoning it.
	storeCtx, cancelStore := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelStore()

	// Receivers start before their senders, and each runs until its
	// senders end its input. The pipeline is the watermark's only sender.
	var stages sync.WaitGroup
	stages.Go(func() { in.wm.run(storeCtx) })
	stages.Go(func() { in.dead.run(storeCtx) })
	stages.Go(func() {
		defer in.wm.close()
		in.pipe.run(storeCtx)
	})
	close(in.started)

	// Scanners that wait for the watermark ask for the full probe rate
	// (again every 100ms while they wait, so an ask lost while the
	// subscription was down is made again).
	wantsCtx, stopWants := context.WithCancel(ctx)
	var wants sync.WaitGroup
	wants.Go(func() { in.pipe.store.Watermarks().Wants(wantsCtx, nil, in.src.want) })
	err := in.src.run(ctx)
	stopWants()
	wants.Wait()
	// The source has stopped probing.
	handedOver := in.opts.SharedGroup == ""
	if len(in.opts.Brokers) > 0 && !handedOver && err == nil {
		if ms, ok := in.src.handOver(in.drain); ok {
			if handedOver = in.wm.passed(ms, in.drain); !handedOver {
				in.log.Warn("signals routed here before the last probe were not stored in time", "wait", in.drain)
			}
		}
		if !handedOver {
			in.log.Warn("could not hand over before stopping; the group waits for the member timeout and records the gap")
		}
	}
	// The handler (and Signal) take no new work from now on: a handler
	// waiting for a slot gives up and leaves its message unacked.
	in.pipe.close()
	in.dead.close()

	// Store and ack what is in flight, for at most drain.
	drain := time.AfterFunc(in.drain, cancelStore)
	defer drain.Stop()
	stages.Wait()
	if len(in.opts.Brokers) > 0 && handedOver && !in.pipe.abandoned.Load() {
		// Stopping on purpose with everything stored: the group's watermark
		// need not wait for this member. A member that gave signals up
		// stays, so the group waits MemberTimeout and records the gap.
		in.wm.leave(context.WithoutCancel(ctx))
	}
	in.src.disconnect()
	in.log.Info("ingest stopped", "handed_over", handedOver)
	return err
}

// Signal pushes the deadline of device id (of type typ) forward from at:
// Signals with one entry. A zero at means the moment it enters the
// pipeline; at is clamped into [now-MaxSkew, now].
func (in *Ingest) Signal(ctx context.Context, id, typ string, at time.Time) error {
	return in.Signals(ctx, []Sig{{ID: id, Type: typ, At: at}})
}

// Connected reports whether ingest is connected to the broker and has
// subscribed at least once (for readiness). Without Brokers there is
// nothing to connect to, and it reports true.
func (in *Ingest) Connected() bool { return in.src.connected() }
