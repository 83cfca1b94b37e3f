// Package ingest turns device messages into deadlines. It subscribes to the
// MQTT broker with a persistent session, parses each topic (and, in payload
// mode, the payload's timestamp), groups the resulting deadlines per shard
// and pushes them forward in Redis (ZADD GT), acknowledging each message to
// the broker only once its deadline is stored. A device that was absent from
// its shard is new or back after being lost: only then does ingest do extra
// work (the registry, and a recovered event).
//
// Ingest also keeps the watermark (DESIGN.md invariant 6): it publishes a
// probe to itself through the broker, and once the probe is back and every
// signal received before it is stored, the time the probe was sent is a time
// up to which ingest is known to have been consuming.
//
// Input that cannot be used is counted, logged at a limited rate, forwarded
// to the dead-letter subject and acknowledged; it never holds up other
// devices.
package ingest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// Options configure ingest. Zero values select the defaults given.
type Options struct {
	Brokers []string // e.g. tcp://127.0.0.1:1883, ssl://...; none: Run serves only Signal
	// ClientID is stable: it names the persistent session (CleanSession=false)
	// that keeps messages while ingest is away, and this member's watermark.
	// With a SharedGroup the session is clean instead: Mosquitto keeps
	// routing shared messages to a disconnected persistent member
	// (eclipse/mosquitto#1747), which would hide live devices' signals.
	ClientID string

	Username, Password string
	TLS                *tls.Config

	Topics []string // MQTT filters, default ["devices/+/signal"]
	// IDLevel is the 0-based topic level carrying the device id, and
	// TypeLevel the level carrying the device type (-1: none). The zero
	// pair (both 0, which could never be valid) selects the defaults 1 and
	// -1.
	IDLevel     int
	TypeLevel   int
	SharedGroup string // if set, subscribe "$share/<group>/<filter>"
	QoS         byte   // default 1

	Thresholds *shard.Thresholds // required

	TimestampMode string        // "receive" (default) or "payload": JSON field "ts", unix ms or RFC 3339
	MaxSkew       time.Duration // payload ts clamped into [now-MaxSkew, now]; default 1m
	MaxIDLen      int           // default 256 bytes

	BatchSize     int           // flush once a shard's batch holds this many signals, default 256
	FlushInterval time.Duration // or once the oldest pending signal waited this long, default 1ms
	MaxInFlight   int           // signals received but not yet stored and acked, default 8192

	ProbeInterval time.Duration // watermark probe period, default DefaultProbeInterval
	ProbeTopic    string        // default "sigwatch/probe/<ClientID>"
	OutageAfter   time.Duration // a watermark gap larger than this is an outage, default 3s
	// MemberTimeout is how long a member that stopped probing (it died)
	// holds its shared group's watermark back, default 10s.
	MemberTimeout time.Duration

	Now func() time.Time // clock, default time.Now
}

const (
	// TimestampReceive stamps a signal with the time ingest received it.
	TimestampReceive = "receive"
	// TimestampPayload takes the signal time from the payload's "ts".
	TimestampPayload = "payload"
)

const (
	// flushers bounds the flushes to Redis running at once.
	flushers = 4
	// drainTimeout bounds how long Run, when stopping, waits for what is
	// in flight to be stored; what is not stored by then is not acked, so
	// the broker delivers it again to the next session.
	drainTimeout = 5 * time.Second
	// invalidQueue bounds refused messages waiting for the dead-letter
	// publish. When it is full they are acked without being forwarded, so
	// a flood of bad input or a NATS outage never holds up good devices.
	invalidQueue = 1024
	// reconnectMax caps paho's reconnect back-off.
	reconnectMax = 2 * time.Second
)

// DefaultProbeInterval is the default watermark probe period. A deadline
// fires only once the watermark has passed it, so the probe period is most
// of the scanner's fire lag; a probe costs one MQTT message and one Redis
// script per ingest member, however many devices and shards there are.
const DefaultProbeInterval = 10 * time.Millisecond

func (o *Options) defaults() error {
	if len(o.Topics) == 0 {
		o.Topics = []string{"devices/+/signal"}
	}
	if o.IDLevel == 0 && o.TypeLevel == 0 {
		o.IDLevel, o.TypeLevel = 1, -1
	}
	if o.TypeLevel < 0 {
		o.TypeLevel = -1
	}
	if o.QoS == 0 {
		o.QoS = 1
	}
	if o.TimestampMode == "" {
		o.TimestampMode = TimestampReceive
	}
	if o.MaxSkew <= 0 {
		o.MaxSkew = time.Minute
	}
	if o.MaxIDLen <= 0 {
		o.MaxIDLen = DefaultMaxIDLen
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 256
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = time.Millisecond
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 8192
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = DefaultProbeInterval
	}
	if o.ProbeTopic == "" {
		o.ProbeTopic = "sigwatch/probe/" + o.ClientID
	}
	if o.OutageAfter <= 0 {
		o.OutageAfter = 3 * time.Second
	}
	if o.MemberTimeout <= 0 {
		o.MemberTimeout = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}

	switch {
	case o.Thresholds == nil:
		return errors.New("ingest: options: Thresholds is required")
	case len(o.Brokers) > 0 && o.ClientID == "":
		return errors.New("ingest: options: set a stable ClientID: it names the persistent session that keeps messages while ingest is away")
	case o.IDLevel < 0:
		return fmt.Errorf("ingest: options: id level %d must be >= 0", o.IDLevel)
	case o.TypeLevel == o.IDLevel:
		return fmt.Errorf("ingest: options: type level %d must differ from the id level (use -1 for none)", o.TypeLevel)
	case o.QoS > 2:
		return fmt.Errorf("ingest: options: QoS %d must be 1 or 2", o.QoS)
	case o.TimestampMode != TimestampReceive && o.TimestampMode != TimestampPayload:
		return fmt.Errorf("ingest: options: timestamp mode %q: use %q or %q", o.TimestampMode, TimestampReceive, TimestampPayload)
	case strings.ContainsAny(o.SharedGroup, "/+#"):
		return fmt.Errorf("ingest: options: shared group %q must not contain '/', '+' or '#'", o.SharedGroup)
	case strings.ContainsAny(o.ProbeTopic, "+#"):
		return fmt.Errorf("ingest: options: probe topic %q must not contain wildcards", o.ProbeTopic)
	}
	return nil
}

// ErrStopped is returned by Signal when ingest has stopped, or stopped
// before the signal was stored.
var ErrStopped = errors.New("ingest: stopped")

// Ingest is the ingest role. Build it with New and start it with Run.
type Ingest struct {
	opts       Options
	payloadTS  bool
	store      *shard.Store
	topo       *shard.Watcher
	writer     *shard.Writer
	pub        *dispatch.Publisher
	log        *slog.Logger
	m          *metrics
	invalidLog limiter
	storeLog   limiter

	// slots bounds signals received but not yet stored and acked; a
	// handler that cannot take a slot waits, so the broker queues.
	slots chan struct{}
	// work carries signals and probe barriers, in the order received, to
	// the collector.
	work chan signal
	// invalid carries refused messages to the dead-letter forwarder.
	invalid chan refusal
	track   tracker

	// gate orders producers (the MQTT handler, Signal) against shutdown:
	// producers hold it shared while they hand work over; Run takes it
	// exclusively to set closed and close work and invalid.
	gate    sync.RWMutex
	closed  bool
	started chan struct{} // closed when Run has started the pipeline
	// stopping is closed when Run begins to stop: producers waiting for a
	// slot give up and leave their message unacked.
	stopping chan struct{}
	ran      atomic.Bool

	// storeCtx is the context of Redis and NATS calls made for work in
	// flight. It outlives Run's ctx by at most drainTimeout.
	storeCtx context.Context
	drain    time.Duration // drainTimeout; tests shorten it

	client      atomic.Pointer[mqtt.Client]
	connectedAt atomic.Int64 // unix ms when the current connection was subscribed; 0 before
	readyWM     atomic.Int64 // highest probe time whose barrier completed
	// brokerDropped is the broker's own count of messages it dropped
	// (Mosquitto's $SYS/broker/publish/messages/dropped), -1 if unknown.
	brokerDropped atomic.Int64

	connFailMu   sync.Mutex // guards the two below, for rate-limited logging
	connFailLast string
	connFailAt   time.Time
	watermark    atomic.Int64 // this member's watermark last stored, unix ms
	abandoned    atomic.Bool  // some signals were given up on while stopping
	startedAt    atomic.Int64 // unix ms when Run started
	wmKick       chan struct{}
}

// New checks opts and builds ingest, registering its metrics on reg (which
// may be nil). pub may be nil: recovered and invalid events are then counted
// and logged but not published.
func New(opts Options, store *shard.Store, topo *shard.Watcher, pub *dispatch.Publisher, reg prometheus.Registerer, log *slog.Logger) (*Ingest, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if store == nil || topo == nil {
		return nil, errors.New("ingest: a store and a topology watcher are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	in := &Ingest{
		opts:      opts,
		payloadTS: opts.TimestampMode == TimestampPayload,
		store:     store,
		topo:      topo,
		pub:       pub,
		log:       log,
		slots:     make(chan struct{}, opts.MaxInFlight),
		work:      make(chan signal, 1024),
		invalid:   make(chan refusal, invalidQueue),
		started:   make(chan struct{}),
		stopping:  make(chan struct{}),
		wmKick:    make(chan struct{}, 1),
		drain:     drainTimeout,
	}
	in.track.ahead = make(map[uint64]struct{})
	// The writer reports the topology epoch ingest writes with, so a
	// doubling's drain knows when no write can land in an old shard.
	name := opts.ClientID
	if name == "" {
		name = "ingest-" + nuid.Next()
	}
	in.writer = shard.NewWriter(store, name, topo.Current, topo.Refresh)
	in.brokerDropped.Store(-1)
	m, err := newMetrics(reg, in)
	if err != nil {
		return nil, err
	}
	in.m = m
	return in, nil
}

func (in *Ingest) now() time.Time { return in.opts.Now() }

// member names this instance among the ingest members that keep the
// watermark.
func (in *Ingest) member() shard.Member {
	return shard.Member{Group: in.opts.SharedGroup, ID: in.opts.ClientID}
}

// Run starts the pipeline, connects to the brokers and subscribes, and runs
// until ctx is done. Stopping, it takes no new messages, stores and acks
// what is in flight (for up to 5s; the rest is left unacked for the broker
// to deliver again), then disconnects. With no Brokers it serves only
// Signal. Run may be called once.
func (in *Ingest) Run(ctx context.Context) error {
	if !in.ran.CompareAndSwap(false, true) {
		return errors.New("ingest: Run may be called only once")
	}
	in.startedAt.Store(in.now().UnixMilli())

	// Work in flight is finished with its own context, so that stopping
	// stores and acks it instead of abandoning it.
	storeCtx, cancelStore := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelStore()
	in.storeCtx = storeCtx

	// The pipeline: handlers → collector → flushers → acks. Run owns
	// every goroutine and stops them in that order, senders before
	// receivers.
	flushes := make(chan *batch, flushers)
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		in.collect(flushes)
	}()
	var flushing sync.WaitGroup
	for range flushers {
		flushing.Go(func() { in.flusher(flushes) })
	}
	// The writer's reports outlive the last write, then it leaves.
	writerCtx, stopWriter := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWriter()
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		in.writer.Run(writerCtx, in.opts.Now, in.log)
	}()
	forwarded := make(chan struct{})
	go func() {
		defer close(forwarded)
		in.forwardInvalid()
	}()
	stopAdvancer := make(chan struct{})
	advanced := make(chan struct{})
	go func() {
		defer close(advanced)
		in.advance(stopAdvancer)
	}()
	close(in.started)

	var (
		client   mqtt.Client
		runErr   error
		stopProb = make(chan struct{})
		probed   = make(chan struct{})
	)
	if len(in.opts.Brokers) > 0 {
		client = mqtt.NewClient(in.clientOptions())
		in.client.Store(&client)
		tok := client.Connect()
		go func() {
			defer close(probed)
			in.probe(client, stopProb)
		}()
		select {
		case <-tok.Done():
			if err := tok.Error(); err != nil {
				runErr = fmt.Errorf("ingest: connect to %v: %w", in.opts.Brokers, err)
			}
		case <-ctx.Done():
		}
		if runErr == nil {
			<-ctx.Done()
		}
	} else {
		// Without a broker, signals come only through Signal, which is
		// synchronous: a barrier through the same pipeline vouches for
		// every signal enqueued before it, as a returning probe does.
		go func() {
			defer close(probed)
			tick := time.NewTicker(in.opts.ProbeInterval)
			defer tick.Stop()
			for {
				select {
				case <-stopProb:
					return
				case <-tick.C:
					in.enqueueBarrier(in.now().UnixMilli())
				}
			}
		}()
		<-ctx.Done()
	}

	// Stop probing, then stop taking messages: a handler waiting for a
	// slot gives up and leaves its message unacked.
	close(stopProb)
	<-probed
	close(in.stopping)
	in.gate.Lock()
	in.closed = true
	close(in.work)
	close(in.invalid)
	in.gate.Unlock()

	// Store and ack what is in flight, for at most drainTimeout.
	drain := time.AfterFunc(in.drain, cancelStore)
	<-collected
	flushing.Wait()
	stopWriter()
	<-reported
	<-forwarded
	close(stopAdvancer)
	<-advanced
	drain.Stop()
	if len(in.opts.Brokers) > 0 && !in.abandoned.Load() {
		// Stopping on purpose with everything stored: the group's watermark
		// need not wait for this member. A member that gave signals up
		// stays, so the group waits MemberTimeout and records the gap.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
		err := in.store.LeaveMember(lctx, in.member())
		cancel()
		if err != nil {
			in.log.Warn("leaving the ingest members failed; the group waits for the member timeout", "err", err)
		}
	}

	if client != nil {
		// Acks were handed to paho before this, so they go out before the
		// DISCONNECT.
		client.Disconnect(250)
	}
	in.log.Info("ingest stopped")
	return runErr
}

// Signal pushes the deadline of device id (of type typ) forward from at,
// through the same pipeline as MQTT messages, and returns once it is
// stored. A zero at means now; at is clamped into [now-MaxSkew, now]. It
// never advances the watermark. It waits for Run to start, and fails with
// ErrStopped once Run is stopping.
func (in *Ingest) Signal(ctx context.Context, id, typ string, at time.Time) error {
	if err := ValidID(id, in.opts.MaxIDLen); err != nil {
		in.m.invalid[reasonOf(err)].Inc()
		return fmt.Errorf("ingest: signal %q: %w", id, err)
	}
	if len(typ) > in.opts.MaxIDLen || !printable(typ) {
		in.m.invalid[ErrBadType.Reason].Inc()
		return fmt.Errorf("ingest: signal %q: %w", id, ErrBadType)
	}
	select {
	case <-in.started:
	case <-ctx.Done():
		return fmt.Errorf("ingest: signal: %w", ctx.Err())
	}
	now := in.now()
	if at.IsZero() {
		at = now
	}
	at = clamp(at, now, in.opts.MaxSkew)
	done := make(chan error, 1)
	if err := in.enqueue(ctx, in.newSignal(id, typ, at, nil, done)); err != nil {
		return fmt.Errorf("ingest: signal: %w", err)
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		// The signal is still stored; the caller just does not wait.
		return fmt.Errorf("ingest: signal: %w", ctx.Err())
	}
}

// newSignal computes the deadline of one signal and the shard it goes to.
func (in *Ingest) newSignal(id, typ string, at time.Time, msg mqtt.Message, done chan error) signal {
	ms := at.UnixMilli()
	return signal{
		id:       id,
		typ:      typ,
		shard:    shard.Of(id, in.topo.Current().Shards),
		at:       ms,
		deadline: ms + in.opts.Thresholds.For(id, typ).Milliseconds(),
		msg:      msg,
		done:     done,
	}
}

// enqueue hands s to the collector once it has an in-flight slot. It hands
// nothing over, and returns an error, when ingest is stopping or ctx ends
// first.
func (in *Ingest) enqueue(ctx context.Context, s signal) error {
	in.gate.RLock()
	defer in.gate.RUnlock()
	if in.closed {
		return ErrStopped
	}
	select {
	case in.slots <- struct{}{}:
	case <-in.stopping:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case in.work <- s:
		return nil
	case <-in.stopping:
	case <-ctx.Done():
	}
	<-in.slots
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return ErrStopped
}

// enqueueBarrier hands the barrier of the probe sent at ms to the collector,
// in order with the signals received before it.
func (in *Ingest) enqueueBarrier(ms int64) {
	in.gate.RLock()
	defer in.gate.RUnlock()
	select {
	case <-in.stopping:
		// A signal before this probe may have been turned away unacked;
		// the probe must not vouch for it.
		return
	default:
	}
	if in.closed {
		return
	}
	select {
	case in.work <- signal{probe: ms}:
	case <-in.stopping:
	}
}

// limiter lets through at most one log line per second and counts the ones
// it held back.
type limiter struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// allow reports whether a line may be logged at now, and how many were
// suppressed since the last one.
func (l *limiter) allow(now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.last) < time.Second {
		l.suppressed++
		return false, 0
	}
	l.last, suppressed, l.suppressed = now, l.suppressed, 0
	return true, suppressed
}
