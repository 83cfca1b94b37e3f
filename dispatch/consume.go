package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/sigwatch/sigwatch/internal/backoff"
	"golang.org/x/sync/errgroup"
)

// ConsumerOptions shape a durable consumer of lost and recovered events
// that every replica of a role shares.
type ConsumerOptions struct {
	Durable     string
	Description string
	// AckWait is how long an event a worker took stays with it before it
	// is delivered to another.
	AckWait time.Duration
	// Workers bounds the events handled at once.
	Workers int
}

// EventHandler handles the events of a consumer. A nil error acks the
// event; any other error delivers it again after a pause that grows with
// its deliveries.
type EventHandler interface {
	Lost(ctx context.Context, ev Lost) error
	Recovered(ctx context.Context, ev Recovered) error
}

// shutdownGrace bounds how long handlers of events in hand may take once
// Consume is stopping; what is not acked by then is redelivered.
const shutdownGrace = 5 * time.Second

// Consumer is a durable consumer of the stream's lost and recovered events.
type Consumer struct {
	p    *Bus
	opts ConsumerOptions
	log  *slog.Logger
	cons jetstream.Consumer
}

// NewConsumer creates (or updates) the durable consumer of opts. A new
// consumer starts with the events published from then on.
func (p *Bus) NewConsumer(ctx context.Context, opts ConsumerOptions, log *slog.Logger) (*Consumer, error) {
	if p.opts.Mode != JetStream {
		return nil, errors.New("dispatch: consuming events needs nats.mode jetstream")
	}
	c := &Consumer{p: p, opts: opts, log: log}
	var err error
	if c.cons, err = c.create(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Run hands the consumer's events to h, at most opts.Workers at once, until
// ctx ends. On shutdown it stops pulling, handles what it holds, and
// returns. A consumer deleted under it is created again.
func (c *Consumer) Run(ctx context.Context, h EventHandler) error {
	// Handlers finish on workCtx, which outlives ctx by the grace.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	// Go blocks while Workers events are in hand, which holds the pull.
	var workers errgroup.Group
	workers.SetLimit(max(1, c.opts.Workers))
	defer workers.Wait()
	cons := c.cons
	for {
		gone, err := c.pull(ctx, cons, cancelWork, func(msg jetstream.Msg) {
			workers.Go(func() error {
				c.handle(workCtx, h, msg)
				return nil
			})
		})
		if err != nil || !gone {
			return err
		}
		c.log.Warn("event consumer deleted under the workers; creating it again", "consumer", c.opts.Durable)
		for {
			if cons, err = c.create(ctx); err == nil {
				break
			}
			if !backoff.Wait(ctx, time.Second) {
				return nil
			}
		}
	}
}

func (c *Consumer) lostPrefix() string      { return c.p.subjects.Prefix + ".lost." }
func (c *Consumer) recoveredPrefix() string { return c.p.subjects.Prefix + ".recovered." }

func (c *Consumer) create(ctx context.Context) (jetstream.Consumer, error) {
	cons, err := c.p.js.CreateOrUpdateConsumer(ctx, c.p.opts.Stream, jetstream.ConsumerConfig{
		Durable:        c.opts.Durable,
		Description:    c.opts.Description,
		FilterSubjects: []string{c.lostPrefix() + ">", c.recoveredPrefix() + ">"},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.opts.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  max(1024, 4*c.opts.Workers),
	})
	if err != nil {
		return nil, fmt.Errorf("dispatch: consumer %s on stream %s: %w", c.opts.Durable, c.p.opts.Stream, err)
	}
	return cons, nil
}

// pull passes each event of cons to handle until ctx is done (gone false)
// or the consumer is deleted (gone true). Once ctx is done it hands over
// what it already pulled, for up to shutdownGrace; then it calls
// cancelWork.
func (c *Consumer) pull(ctx context.Context, cons jetstream.Consumer, cancelWork func(), handle func(jetstream.Msg)) (gone bool, err error) {
	it, err := cons.Messages(jetstream.PullMaxMessages(max(1, c.opts.Workers)))
	if err != nil {
		return false, fmt.Errorf("dispatch: consume: %w", err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() { // Stops the iterator; ends with pull.
		select {
		case <-ctx.Done():
			it.Drain()
			t := time.NewTimer(shutdownGrace)
			defer t.Stop()
			select {
			case <-t.C:
				it.Stop()
				cancelWork()
			case <-done:
			}
		case <-done:
			it.Stop()
		}
	}()
	failures := 0
	for {
		msg, err := it.Next()
		switch {
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			return false, nil
		case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
			return true, nil
		case err != nil:
			// Heartbeats missed (NATS unreachable): the iterator reconnects.
			failures++
			if failures == 1 || failures%20 == 0 {
				c.log.Warn("events: pull failed; retrying", "err", err, "failures", failures)
			}
			// Once ctx is done the iterator closes; until then, pause.
			backoff.Wait(ctx, min(time.Duration(failures)*100*time.Millisecond, 2*time.Second))
			continue
		}
		failures = 0
		handle(msg)
	}
}

// handle decodes one event, passes it on and acknowledges it once handled;
// otherwise it is delivered again after a pause.
func (c *Consumer) handle(ctx context.Context, h EventHandler, msg jetstream.Msg) {
	var err error
	read := true
	subj := msg.Subject()
	switch {
	case strings.HasPrefix(subj, c.lostPrefix()):
		var ev Lost
		if read = c.read(msg, &ev, &ev.Device); read {
			err = h.Lost(ctx, ev)
		}
	case strings.HasPrefix(subj, c.recoveredPrefix()):
		var ev Recovered
		if read = c.read(msg, &ev, &ev.Device); read {
			err = h.Recovered(ctx, ev)
		}
	}
	if !read {
		return
	}
	if err != nil {
		delay := time.Second
		if md, mdErr := msg.Metadata(); mdErr == nil {
			delay = min(time.Duration(md.NumDelivered)*time.Second, 30*time.Second)
		}
		c.log.Warn("event not handled; redelivered later", "subject", subj, "err", err, "in", delay)
		_ = msg.NakWithDelay(delay)
		return
	}
	// A lost ack is harmless: the event comes again and changes nothing.
	_ = msg.Ack()
}

// read decodes msg into ev, which must name a device. An event that cannot
// be read is dropped: redelivering it cannot help.
func (c *Consumer) read(msg jetstream.Msg, ev any, device *string) bool {
	err := json.Unmarshal(msg.Data(), ev)
	if err == nil && *device != "" {
		return true
	}
	c.log.Error("event unreadable; dropped", "subject", msg.Subject(), "err", err, "body", string(msg.Data()))
	_ = msg.Term()
	return false
}
