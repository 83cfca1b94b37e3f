package alarm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
)

// Options configure the alarms. Zero values select the defaults given.
type Options struct {
	Policy Policy // default: 5m interval, no backoff, 1h cap, unlimited repeats, flapping at >5 in 10m, stable after 10m

	// Replica names this process among the repeat timers' engines (unique,
	// like the deadline scanner's). Required by Run; a process that only serves
	// the API (Ack, Remove, mutes) leaves it empty.
	Replica string
	// Consumer is the durable consumer every replica shares, default
	// "sigwatch-alarm".
	Consumer string
	// AckWait is how long an event a worker took stays with it before it is
	// delivered to another, default 30s.
	AckWait time.Duration
	// Workers bounds the events handled at once, and the timers of one
	// claimed batch, default 32.
	Workers int

	// Engine is the repeat timers' engine settings (the scanner section: a
	// zero field takes queue.DefaultConfig's) and Rebalance their
	// membership period (see queue.Options).
	Engine    queue.Config
	Rebalance time.Duration
	// DrainCheck is the repeat timers' drain period during a doubling of
	// them, default 5s.
	DrainCheck time.Duration

	// CountEvery is the period of the active gauges' count, default 2s (it
	// reads only the open-alarm index).
	CountEvery time.Duration
	// Rate and RateTotal cap the notifications per second of each type and
	// of all types together, across every replica sharing the Redis (0:
	// unlimited, the default); see rate.go.
	Rate      float64
	RateTotal float64

	// Registry is the durable device registry: each alarm state written
	// is kept there too, so that a Redis that loses it gets it back (nil:
	// none).
	Registry *dispatch.Registry
	// Storm is the storm detection; the zero value is off.
	Storm StormConfig
	// Threshold is a device's threshold, the storm window when
	// Storm.Window is 0 (nil: 30s).
	Threshold func(id, typ string) time.Duration
	// Now is the clock, default time.Now.
	Now func() time.Time
	// BeforeNotify is a test seam: when set, it is called on the event and
	// API paths after a transition is stored and before what it decided is
	// published, with what is about to go out ("raised", "resolved", …, or
	// "storm").
	BeforeNotify func(what string)
}

// DefaultPolicy is the policy of an unconfigured alarm.
var DefaultPolicy = Policy{
	Interval: 5 * time.Minute, Backoff: 1, MaxInterval: time.Hour,
	FlapCount: 5, FlapWindow: 10 * time.Minute, FlapStable: 10 * time.Minute,
}

func (o *Options) defaults() {
	if o.Policy.Interval <= 0 {
		o.Policy.Interval = DefaultPolicy.Interval
	}
	if o.Policy.Backoff < 1 {
		o.Policy.Backoff = 1
	}
	if o.Policy.MaxInterval < o.Policy.Interval {
		o.Policy.MaxInterval = max(o.Policy.Interval, DefaultPolicy.MaxInterval)
	}
	if o.Policy.FlapCount > 0 {
		o.Policy.FlapWindow = cmp.Or(o.Policy.FlapWindow, DefaultPolicy.FlapWindow)
		o.Policy.FlapStable = cmp.Or(o.Policy.FlapStable, DefaultPolicy.FlapStable)
	}
	o.Consumer = cmp.Or(o.Consumer, "sigwatch-alarm")
	if o.AckWait <= 0 {
		o.AckWait = DefaultConfig().AckWait
	}
	if o.Workers <= 0 {
		o.Workers = DefaultConfig().Workers
	}
	if o.CountEvery <= 0 {
		o.CountEvery = 2 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Alarms is the alarm state of every device and what changes it.
type Alarms struct {
	opts   Options
	store  *shard.Store   // deadlines, registry, alarm state, mutes
	topo   *shard.Watcher // the deadlines' topology
	timers *shard.Store   // the repeat timers' queue
	rtopo  *shard.Watcher // its topology
	pub    *dispatch.Bus
	log    *slog.Logger
	m      *metrics
	engine *queue.Engine // the repeat timers' engine, nil without Options.Replica
	storms storms
	// notes fences the notifications no repeat timer shard fences: those
	// of events and of the API (see fences.go).
	notes *dispatch.Lapsing

	running atomic.Bool
}

// New returns the alarms. store and topo are the deadline queue's; timers
// and timerTopo the repeat timers' queue (Store.Sub("alarm")). pub must
// publish to JetStream. reg may be nil.
func New(opts Options, store *shard.Store, topo *shard.Watcher, timers *shard.Store, timerTopo *shard.Watcher,
	pub *dispatch.Bus, reg prometheus.Registerer, log *slog.Logger) (*Alarms, error) {
	opts.defaults()
	switch {
	case store == nil || topo == nil || timers == nil || timerTopo == nil:
		return nil, errors.New("alarm: the deadline and repeat timer stores and their topology watchers are required")
	case pub == nil:
		return nil, errors.New("alarm: a publisher is required")
	case pub.Mode() != dispatch.JetStream:
		return nil, errors.New("alarm: alarms need nats.mode jetstream: they consume the lost and recovered events from the stream")
	}
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	reg = cmp.Or(reg, prometheus.Registerer(prometheus.NewRegistry()))
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	a := &Alarms{opts: opts, store: store, topo: topo, timers: timers, rtopo: timerTopo, pub: pub, log: log, m: m,
		notes: pub.Lapsing(notesScope, cmp.Or(opts.Replica, "api"), min(opts.Workers, maxNoteLanes))}
	if opts.Replica != "" {
		a.engine, err = queue.New(queue.Options{
			Replica: opts.Replica, Family: shard.Repeats, Name: "repeats", Watermark: store,
			Config: opts.Engine, Rebalance: opts.Rebalance,
			DrainCheck: opts.DrainCheck, Now: opts.Now, Fencer: repeats{a},
		}, timers, timerTopo, repeats{a}, reg, log.With("queue", "repeats"))
		if err != nil {
			return nil, fmt.Errorf("alarm: repeat timers: %w", err)
		}
	}
	return a, nil
}

// Run handles lost and recovered events and fires repeat timers until ctx
// is done. It needs Options.Replica and may be called once.
func (a *Alarms) Run(ctx context.Context) error {
	if a.engine == nil {
		return errors.New("alarm: Run needs Options.Replica: give each process a unique replica id")
	}
	if !a.running.CompareAndSwap(false, true) {
		return errors.New("alarm: Run called twice")
	}
	cons, err := a.pub.NewConsumer(ctx, a.consumerOptions(), a.log)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	timerCtx, stopTimers := context.WithCancel(context.WithoutCancel(ctx))
	defer stopTimers()
	var wg sync.WaitGroup
	timerErr := make(chan error, 1)
	wg.Go(func() { timerErr <- a.engine.Run(timerCtx) })
	wg.Go(func() { a.countLoop(timerCtx, a.engine.Owned, a.opts.CountEvery) })

	err = cons.Run(ctx, events{a})
	// Events first, then timers: the engine finishes its in-flight batch.
	stopTimers()
	wg.Wait()
	a.m.set(counts{})
	return errors.Join(err, <-timerErr)
}

// ErrNoAlarm is returned by Ack for a device without an open alarm.
var ErrNoAlarm = errors.New("the device has no open alarm")

// View is what the API shows of a device's alarm.
type View struct {
	Device string `json:"device"`
	// Scope and Group name a group's or the fleet's alarm, which has no
	// device.
	Scope string `json:"scope,omitempty"`
	Group string `json:"group,omitempty"`
	// State is raised (repeating), acked (repeats paused until AckedUntil),
	// held (its raise waits for the storm hold or a storm), flapping, or
	// idle.
	State      string `json:"state"`
	Since      int64  `json:"since,omitempty"`
	Count      int    `json:"count"`
	Next       int64  `json:"next,omitempty"`
	AckedUntil int64  `json:"acked_until,omitempty"`
	AckedBy    string `json:"acked_by,omitempty"` // who last acked it
	Last       string `json:"last,omitempty"`     // last notification: state/reason
	At         int64  `json:"at,omitempty"`
}

func view(id string, st State) View {
	v := View{Device: id, State: "idle", Count: st.Count, Last: st.Last, At: st.At, Group: st.Group, AckedBy: st.AckedBy}
	if sc, ok := scopeOf(id); ok {
		v.Device = ""
		v.Scope, v.Group = scopeName(sc)
	}
	switch st.Phase {
	case Active:
		v.State, v.Since, v.Next = Raised, st.Since, st.Next
		if st.Held {
			v.State = Held
		}
		if st.AckedUntil > 0 {
			v.State, v.AckedUntil, v.Next = Acked, st.AckedUntil, 0
		}
	case Damped:
		v.State, v.Since = Flapping, st.Since
	}
	return v
}

// Get returns id's alarm, and false if it never had one.
func (a *Alarms) Get(ctx context.Context, id string) (View, bool, error) {
	st, err := a.load(ctx, id)
	if err != nil {
		return View{}, false, err
	}
	return view(id, st.State), st.raw != "", nil
}

// Ack acknowledges id's open alarm. With a zero until it is resolved
// (reason acked); with a later until its repeats pause until then and
// resume if the device is still silent. It fails with ErrNoAlarm when
// there is no open alarm. by is who acks (the API caller's name), kept
// in the state and shown as acked_by.
func (a *Alarms) Ack(ctx context.Context, id string, until time.Time, by string) (View, error) {
	fence, fenceErr := a.notes.Take(ctx)
	now := a.opts.Now()
	var u int64
	if !until.IsZero() {
		if !until.After(now) {
			return View{}, errors.New("ack until a time in the past: leave until out to resolve the alarm")
		}
		u = until.UnixMilli()
	}
	m := a.machine(id, now)
	st, err := a.transition(ctx, id, now, func(st *State) (bool, error) {
		if !m.ack(st, u, by) {
			return false, ErrNoAlarm
		}
		return true, nil
	})
	if err != nil {
		return View{}, err
	}
	return view(id, a.settle(ctx, id, st, fence, fenceErr).State), nil
}

// Remove resolves id's alarm (reason removed) when the device is no
// longer watched, and reports whether one was open; lost events from
// before now raise nothing for the device.
func (a *Alarms) Remove(ctx context.Context, id string) (bool, error) {
	fence, fenceErr := a.notes.Take(ctx)
	now := a.opts.Now()
	m := a.machine(id, now)
	var open bool
	var group string
	st, err := a.transition(ctx, id, now, func(st *State) (bool, error) {
		open, group = st.Phase != Idle, st.Group
		m.remove(st)
		return true, nil
	})
	if err != nil {
		return false, err
	}
	if a.stormsOn() {
		if err := a.stormBack(ctx, []string{group}, id, fence); err != nil {
			a.log.Warn("removed device not taken out of its storm counts", "device", id, "err", err)
		}
	}
	a.settle(ctx, id, st, fence, fenceErr)
	return open, nil
}

// settle publishes what a transition made by the API decided, under the
// fence taken before it (or not, when taking it failed). A failure is not
// the caller's: the transition is stored and the device's timer publishes
// it later.
func (a *Alarms) settle(ctx context.Context, id string, st stored, fence dispatch.Fence, fenceErr error) stored {
	a.beforeNotify(st)
	out, err := st, fenceErr
	if err == nil {
		out, err = a.flush(ctx, id, st, fence)
	}
	if err != nil {
		a.log.Warn("alarm notification not published yet; retried by its timer", "device", id, "err", err)
		return st
	}
	return out
}

// machine returns the state machine of device id at now; new alarms of a
// device of type typ are held for the storm hold.
func (a *Alarms) machine(id string, now time.Time) machine {
	m := machine{p: a.opts.Policy, id: id, now: now.UnixMilli()}
	if sc, ok := scopeOf(id); ok {
		_, m.group = scopeName(sc)
	}
	return m
}

// deviceMachine is machine for a device of type typ, whose new alarms are
// held for the storm hold.
func (a *Alarms) deviceMachine(id, typ string, now time.Time) machine {
	m := a.machine(id, now)
	if _, ok := scopeOf(id); !ok {
		m.hold = a.hold(id, typ).Milliseconds()
	}
	return m
}
