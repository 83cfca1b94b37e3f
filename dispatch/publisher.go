package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Publisher publishes sigwatch's messages. It is safe for concurrent use.
type Publisher struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	opts     Options
	subjects Subjects
	owned    bool // the connection is the publisher's, from Dial
}

// New returns a publisher on nc. In JetStream mode it creates the stream if
// it is absent and checks that an existing one covers the subjects.
func New(ctx context.Context, nc *nats.Conn, opts Options) (*Publisher, error) {
	opts.defaults()
	p := &Publisher{nc: nc, opts: opts, subjects: Subjects{Prefix: opts.Prefix}}
	switch opts.Mode {
	case Core:
		return p, nil
	case JetStream:
	default:
		return nil, fmt.Errorf("dispatch: unknown mode %q: use %q or %q", opts.Mode, JetStream, Core)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(opts.MaxPending))
	if err != nil {
		return nil, fmt.Errorf("dispatch: jetstream: %w", err)
	}
	p.js = js
	if err := p.ensureStream(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Publisher) ensureStream(ctx context.Context) error {
	storage := jetstream.FileStorage
	switch p.opts.Storage {
	case "file":
	case "memory":
		storage = jetstream.MemoryStorage
	default:
		return fmt.Errorf("dispatch: stream storage %q: use file or memory", p.opts.Storage)
	}
	s, err := p.js.Stream(ctx, p.opts.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = p.js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        p.opts.Stream,
			Description: "sigwatch events",
			Subjects:    []string{p.subjects.All()},
			Storage:     storage,
			Replicas:    p.opts.Replicas,
			Duplicates:  p.opts.Duplicates,
			MaxAge:      p.opts.MaxAge,
		})
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("dispatch: create stream %s: %w", p.opts.Stream, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("dispatch: look up stream %s: %w", p.opts.Stream, err)
	}
	cfg := s.CachedInfo().Config
	for _, subj := range cfg.Subjects {
		if subj == p.subjects.All() {
			return nil
		}
	}
	return fmt.Errorf("dispatch: stream %s exists but does not listen on %s (it has %v): add the subject or configure another stream name",
		p.opts.Stream, p.subjects.All(), cfg.Subjects)
}

// Mode returns the delivery mode.
func (p *Publisher) Mode() Mode { return p.opts.Mode }

// Subjects returns the subjects the publisher sends on.
func (p *Publisher) Subjects() Subjects { return p.subjects }

// Close drains the connection of a publisher from Dial (publishes in flight
// are flushed) and closes it, waiting up to a second. It leaves a
// connection given to New open.
func (p *Publisher) Close() {
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
func (p *Publisher) Connected() bool { return p.nc.IsConnected() }

// Publish sends msgs and waits until each is acknowledged (JetStream) or
// flushed to the server (core). errs[i] is nil when msgs[i] is safely
// stored; callers remove only what was published. A message JetStream
// reports as a duplicate was stored before and counts as published.
func (p *Publisher) Publish(ctx context.Context, msgs []Message) (errs []error) {
	return p.publish(ctx, Fence{}, msgs)
}

func (p *Publisher) publish(ctx context.Context, fence Fence, msgs []Message) (errs []error) {
	errs = make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	// Both modes wait for the server: core NATS for a flush (which needs a
	// deadline), JetStream for the acknowledgements.
	ctx, cancel := context.WithTimeout(ctx, p.opts.AckWait)
	defer cancel()
	if p.opts.Mode == Core {
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
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		nm := nats.NewMsg(m.Subject)
		nm.Data = m.Body
		fence.apply(nm)
		f, err := p.js.PublishMsgAsync(nm, jetstream.WithMsgID(m.ID))
		if err != nil {
			errs[i] = fmt.Errorf("dispatch: publish %s: %w", m.Subject, err)
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if isFenced(err) {
				err = fmt.Errorf("%w (%v)", ErrFenced, err)
			}
			errs[i] = fmt.Errorf("dispatch: publish %s: %w", msgs[i].Subject, err)
		case <-ctx.Done():
			errs[i] = fmt.Errorf("dispatch: publish %s: no ack: %w", msgs[i].Subject, ctx.Err())
		}
	}
	return errs
}
