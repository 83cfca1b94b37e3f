package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Bus is sigwatch's door to NATS: it publishes events under fences,
// runs the consumers, and opens the streams and the durable registry. It
// is safe for concurrent use.
type Bus struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	room     *inflight // bounds the asynchronous publishes of js
	opts     Options
	subjects Subjects
	owned    bool // the connection is the publisher's, from Dial

	// atomic says the stream takes atomic batches (see atomic.go).
	atomic          bool
	atomicRoom      chan struct{} // bounds the atomic batches in flight
	batchIDs        *batchIDs
	atomicBatches   prometheus.Counter
	atomicFallbacks prometheus.Counter

	// fast says the stream takes fast batches (see fast.go).
	fast   bool
	fastIn *fastInbox

	// ttl says the stream takes per-message TTLs: lapsing fences (lapse.go).
	ttl           bool
	fastBatches   prometheus.Counter
	fastFallbacks prometheus.Counter
}

// New returns a publisher on nc. In JetStream mode it creates the stream if
// it is absent and checks that an existing one covers the subjects.
func New(ctx context.Context, nc *nats.Conn, opts Options) (*Bus, error) {
	opts.defaults()
	types, err := newTypeTokens(opts.Types, opts.MaxTypes, opts.Registerer, opts.Log)
	if err != nil {
		return nil, fmt.Errorf("dispatch: metrics: %w", err)
	}
	p := &Bus{nc: nc, opts: opts, subjects: Subjects{Prefix: opts.Prefix, types: types},
		atomicBatches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sigwatch", Subsystem: "dispatch",
			Name: "atomic_batches_total", Help: "Fenced batches of events the stream stored as one atomic batch."}),
		atomicFallbacks: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sigwatch", Subsystem: "dispatch",
			Name: "atomic_fallbacks_total", Help: "Fenced batches of events the stream did not take as an atomic batch (an event stored before, too many batches in flight, no answer), sent again message by message."}),
		fastBatches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sigwatch", Subsystem: "dispatch",
			Name: "fast_batches_total", Help: "Fenced batches of events the stream stored whole as one fast batch."}),
		fastFallbacks: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sigwatch", Subsystem: "dispatch",
			Name: "fast_fallbacks_total", Help: "Fenced fast batches the stream stored only in part or not at all (a fence, no answer); the rest was sent again message by message."})}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{p.atomicBatches, p.atomicFallbacks, p.fastBatches, p.fastFallbacks} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("dispatch: metrics: %w", err)
			}
		}
	}
	switch opts.Mode {
	case Core:
		return p, nil
	case JetStream:
	default:
		return nil, fmt.Errorf("dispatch: unknown mode %q: use %q or %q", opts.Mode, JetStream, Core)
	}
	// A publish whose acknowledgement never comes (the stream leader died
	// with it, while this connection stayed up) gives its slot of
	// MaxPending back after AckWait; otherwise failovers would use the
	// slots up one by one until every publish stalls.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(opts.MaxPending),
		jetstream.WithPublishAsyncTimeout(opts.AckWait))
	if err != nil {
		return nil, fmt.Errorf("dispatch: jetstream: %w", err)
	}
	p.js, p.room = js, newInflight(opts.MaxPending)
	if err := p.ensureStream(ctx); err != nil {
		return nil, err
	}
	p.atomicRoom, p.batchIDs = make(chan struct{}, maxAtomicInflight), newBatchIDs()
	if p.fast {
		if p.fastIn, err = newFastInbox(nc); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// storage is the JetStream storage nats.storage names, for the stream and
// the registry's bucket alike; of names which one a refusal is about.
func (p *Bus) storage(of string) (jetstream.StorageType, error) {
	switch p.opts.Storage {
	case "file":
		return jetstream.FileStorage, nil
	case "memory":
		return jetstream.MemoryStorage, nil
	}
	return jetstream.FileStorage, fmt.Errorf("dispatch: %s storage %q: use file or memory", of, p.opts.Storage)
}

// ensureStream creates the stream if it is absent and otherwise makes it
// follow the configuration: the limits and the de-duplication window are
// updated in place; what a stream cannot change (its storage) is refused.
func (p *Bus) ensureStream(ctx context.Context) error {
	storage, err := p.storage("stream")
	if err != nil {
		return err
	}
	limit := func(v int64) int64 { return cmp.Or(max(v, 0), -1) }
	want := jetstream.StreamConfig{
		Name:        p.opts.Stream,
		Description: "sigwatch events",
		Subjects:    p.subjects.Stream(),
		Storage:     storage,
		Replicas:    p.opts.Replicas,
		Duplicates:  p.opts.Duplicates,
		MaxAge:      p.opts.MaxAge,
		MaxBytes:    limit(p.opts.MaxBytes),
		MaxMsgs:     limit(p.opts.MaxMsgs),
		// A shard's events go out in atomic or fast batches where the
		// server has them (2.12+, 2.14+); an older one ignores these.
		AllowAtomicPublish: true,
		AllowBatchPublish:  true,
		// Lapsing fences expire by a per-message TTL (2.11+).
		AllowMsgTTL: true,
	}
	s, err := p.js.Stream(ctx, p.opts.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		var created jetstream.Stream
		created, err = p.js.CreateStream(ctx, want)
		if err == nil {
			p.atomic, p.fast = takesAtomic(created.CachedInfo().Config), takesFast(created.CachedInfo().Config)
			p.ttl = created.CachedInfo().Config.AllowMsgTTL
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("dispatch: create stream %s: %w", p.opts.Stream, err)
		}
		// Another process created it meanwhile: make it follow ours.
		s, err = p.js.Stream(ctx, p.opts.Stream)
	}
	if err != nil {
		return fmt.Errorf("dispatch: look up stream %s: %w", p.opts.Stream, err)
	}
	cfg := s.CachedInfo().Config
	subjects := cfg.Subjects
	if slices.Contains(cfg.Subjects, p.subjects.All()) {
		// A stream from before the timer resets had a stream of their own
		// listened on the whole prefix: it moves to the event subjects.
		subjects = want.Subjects
	}
	for _, sub := range want.Subjects {
		if !slices.Contains(subjects, sub) && slices.Contains(p.subjects.added(), sub) {
			subjects = append(slices.Clone(subjects), sub)
		}
		if !slices.Contains(subjects, sub) {
			return fmt.Errorf("dispatch: stream %s exists but does not listen on %s (it has %v): add the subject or configure another stream name",
				p.opts.Stream, sub, cfg.Subjects)
		}
	}
	if cfg.Storage != storage {
		return fmt.Errorf("dispatch: stream %s has %s storage but nats.storage is %s: a stream's storage cannot change; set nats.storage to match, or move the events to a new stream (nats.stream)",
			p.opts.Stream, cfg.Storage, storage)
	}
	if cfg.MaxAge == want.MaxAge && cfg.Duplicates == want.Duplicates && cfg.MaxBytes == want.MaxBytes &&
		cfg.MaxMsgs == want.MaxMsgs && cfg.Replicas == want.Replicas && slices.Equal(cfg.Subjects, subjects) &&
		cfg.AllowAtomicPublish && cfg.AllowBatchPublish && cfg.AllowMsgTTL {
		p.atomic, p.fast, p.ttl = takesAtomic(cfg), takesFast(cfg), true
		return nil
	}
	next := cfg
	next.Subjects = subjects
	next.MaxAge, next.Duplicates, next.MaxBytes, next.MaxMsgs, next.Replicas =
		want.MaxAge, want.Duplicates, want.MaxBytes, want.MaxMsgs, want.Replicas
	next.AllowAtomicPublish, next.AllowBatchPublish, next.AllowMsgTTL = true, true, true
	updated, err := p.js.UpdateStream(ctx, next)
	if err == nil {
		p.atomic, p.fast = takesAtomic(updated.CachedInfo().Config), takesFast(updated.CachedInfo().Config)
		p.ttl = updated.CachedInfo().Config.AllowMsgTTL
	}
	if err != nil {
		return fmt.Errorf("dispatch: stream %s: apply max_age %v, duplicates %v, max_bytes %d, max_msgs %d, replicas %d (it has %v, %v, %d, %d, %d): %w",
			p.opts.Stream, want.MaxAge, want.Duplicates, want.MaxBytes, want.MaxMsgs, want.Replicas,
			cfg.MaxAge, cfg.Duplicates, cfg.MaxBytes, cfg.MaxMsgs, cfg.Replicas, err)
	}
	if p.opts.Log != nil {
		p.opts.Log.Info("event stream updated to the configuration", "stream", p.opts.Stream,
			"max_age", want.MaxAge, "duplicates", want.Duplicates, "max_bytes", want.MaxBytes, "max_msgs", want.MaxMsgs, "replicas", want.Replicas)
	}
	return nil
}

// takesAtomic reports whether fenced events go out in atomic batches into a
// stream of configuration cfg: where the server allows them, and the
// stream is replicated. A single-server stream checks the fences of a
// batch's messages one after another at full speed, while an atomic batch
// costs it a staging store; a replicated one checks one fence of a subject
// at a time and refuses the rest (see atomic.go).
func takesAtomic(cfg jetstream.StreamConfig) bool {
	return cfg.AllowAtomicPublish && cfg.Replicas > 1
}

// takesFast reports whether fenced events go out in fast batches into a
// stream of configuration cfg: where the server allows them, and the
// stream has one server (a replicated one takes atomic batches).
func takesFast(cfg jetstream.StreamConfig) bool {
	return cfg.AllowBatchPublish && cfg.Replicas <= 1
}

// Mode returns the delivery mode.
func (p *Bus) Mode() Mode { return p.opts.Mode }

// Subjects returns the subjects the publisher sends on.
func (p *Bus) Subjects() Subjects { return p.subjects }

// Close drains the connection of a publisher from Dial (publishes in flight
// are flushed) and closes it, waiting up to a second. It leaves a
// connection given to New open, with nothing of the publisher's
// subscribed.
func (p *Bus) Close() {
	if p.fastIn != nil {
		_ = p.fastIn.sub.Unsubscribe()
	}
	if !p.owned {
		return
	}
	_ = p.nc.Drain()
	for i := 0; i < 50 && !p.nc.IsClosed(); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	p.nc.Close()
}

// Connected reports whether the NATS connection is up.
func (p *Bus) Connected() bool { return p.nc.IsConnected() }

// Publish sends msgs and waits until each is acknowledged (JetStream) or
// flushed to the server (core). errs[i] is nil when msgs[i] is safely
// stored; callers remove only what was published. A message JetStream
// reports as a duplicate was stored before and counts as published.
func (p *Bus) Publish(ctx context.Context, msgs []Message) (errs []error) {
	return p.publish(ctx, Fence{}, msgs)
}

func (p *Bus) publish(ctx context.Context, fence Fence, msgs []Message) (errs []error) {
	errs = make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	if p.opts.Mode == Core {
		// Core NATS waits for a flush, which needs a deadline.
		ctx, cancel := context.WithTimeout(ctx, p.opts.AckWait)
		defer cancel()
		var err error
		for _, m := range msgs {
			nm := nats.NewMsg(m.Subject)
			nm.Header.Set(nats.MsgIdHdr, m.ID)
			nm.Data = m.Body
			if err = p.nc.PublishMsg(nm); err != nil {
				break
			}
		}
		if err == nil {
			err = p.nc.FlushWithContext(ctx)
		}
		if err != nil {
			for i := range errs {
				errs[i] = fmt.Errorf("dispatch: publish: %w", err)
			}
		}
		return errs
	}
	switch {
	case p.atomic && fence.Subject != "":
		return p.publishAtomic(ctx, fence, msgs)
	case p.fast && fence.Subject != "":
		return p.publishFast(ctx, fence, msgs)
	}
	return p.publishEach(ctx, fence, msgs)
}

// publishEach publishes msgs one message each, asynchronously, under fence
// (if any), and waits for their acknowledgements.
func (p *Bus) publishEach(ctx context.Context, fence Fence, msgs []Message) (errs []error) {
	errs = make([]error, len(msgs))
	ctx, cancel := context.WithTimeout(ctx, p.opts.AckWait)
	defer cancel()
	all := make([]int, len(msgs))
	for i := range all {
		all[i] = i
	}
	// A replicated stream checks one fence of a subject at a time and
	// refuses the other messages of the batch in flight with it: those go
	// out again one after another, until each is stored or refused for
	// good. Once ctx is done, what is left keeps its error and is not sent.
	busy := p.publishAsync(ctx, fence, msgs, all, errs)
	for len(busy) > 0 && ctx.Err() == nil {
		if again := p.publishAsync(ctx, fence, msgs, busy[:1], errs); len(again) == 0 {
			busy = busy[1:]
		} else {
			// The message in flight is slow to settle (an election, say).
			sleep(ctx, fenceBusyWait)
		}
	}
	return errs
}

// fenceBusyWait is the pause before a fenced message is sent again after
// a refusal that came while nothing else of its batch was in flight, so
// that a stream that cannot settle the message in flight is not asked
// again at once.
const fenceBusyWait = 20 * time.Millisecond

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// publishAsync publishes msgs[i] for each i of todo, waits for their
// acknowledgements and sets errs[i]. It returns the indexes of those the
// stream refused only because another message checking the same fence was
// in flight, while ctx allows another try. It waits for room among the
// publishes in flight (Options.MaxPending) first, a part of todo at a time
// if todo is larger.
func (p *Bus) publishAsync(ctx context.Context, fence Fence, msgs []Message, todo []int, errs []error) (again []int) {
	for len(todo) > 0 {
		part := todo[:min(len(todo), p.room.max)]
		if err := p.room.acquire(ctx, len(part)); err != nil {
			for _, i := range todo {
				errs[i] = fmt.Errorf("dispatch: publish %s: waiting for room among the publishes in flight: %w", msgs[i].Subject, err)
			}
			return again
		}
		again = append(again, p.publishPart(ctx, fence, msgs, part, errs)...)
		todo = todo[len(part):]
	}
	return again
}

// publishPart is publishAsync for a part that has its room.
func (p *Bus) publishPart(ctx context.Context, fence Fence, msgs []Message, todo []int, errs []error) (again []int) {
	settled, pending := 0, []jetstream.PubAckFuture(nil)
	defer func() { p.room.release(settled, pending) }()
	futures := make([]jetstream.PubAckFuture, len(todo))
	for k, i := range todo {
		m := msgs[i]
		nm := nats.NewMsg(m.Subject)
		nm.Data = m.Body
		fence.apply(nm)
		f, err := p.js.PublishMsgAsync(nm, jetstream.WithMsgID(m.ID))
		if err != nil {
			errs[i] = fmt.Errorf("dispatch: publish %s: %w", m.Subject, err)
			settled++
			continue
		}
		futures[k] = f
	}
	for k, f := range futures {
		if f == nil {
			continue
		}
		i := todo[k]
		select {
		case <-f.Ok():
			settled++
			errs[i] = nil
		case err := <-f.Err():
			settled++
			if isFenceBusy(err) && ctx.Err() == nil {
				again = append(again, i)
			} else if isFenced(err) {
				err = fmt.Errorf("%w (%v)", ErrFenced, err)
			}
			errs[i] = fmt.Errorf("dispatch: publish %s: %w", msgs[i].Subject, err)
		case <-ctx.Done():
			pending = append(pending, f)
			errs[i] = fmt.Errorf("dispatch: publish %s: no ack: %w", msgs[i].Subject, ctx.Err())
		}
	}
	return again
}
