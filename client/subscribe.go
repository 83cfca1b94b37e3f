package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Event is a fired timer, as sigwatch publishes it on
// <prefix>.timer.<queue>. ID, "<queue>/<timer>@<deadline>", is the same
// for every delivery of the same fire.
type Event struct {
	ID       string          `json:"id"`
	Queue    string          `json:"queue"`
	Timer    string          `json:"timer"`
	Deadline int64           `json:"deadline"` // unix ms
	FiredAt  int64           `json:"fired_at"` // unix ms
	Payload  json.RawMessage `json:"payload"`  // null when the timer had none
}

// Decode decodes the payload into v.
func (e Event) Decode(v any) error { return json.Unmarshal(e.Payload, v) }

// Handler handles one event. nil acknowledges it; an error has it delivered
// again after RetryDelay.
type Handler func(ctx context.Context, ev Event) error

// RetryDelay is how long an event a handler failed waits before it is
// delivered again.
const RetryDelay = time.Second

// Subscription is a running Subscribe.
type Subscription struct {
	cc     jetstream.ConsumeContext
	cancel context.CancelFunc
}

// Stop stops the deliveries; the events not yet acknowledged go to the
// other subscribers of the durable, or to the next Subscribe.
func (s *Subscription) Stop() {
	s.cancel()
	s.cc.Stop()
}

// Subscribe runs handler for each event of queue through the durable
// JetStream consumer named durable on sigwatch's event stream, created if
// absent. Processes that subscribe with the same durable share the events;
// each event is handled until one handler returns nil. The consumer starts
// with the events stored from its creation on.
func (c *Client) Subscribe(ctx context.Context, queue, durable string, handler Handler) (*Subscription, error) {
	if c.js == nil {
		return nil, errors.New("client: Subscribe needs Options.NATS")
	}
	if err := CheckQueue(queue); err != nil {
		return nil, err
	}
	if durable == "" {
		return nil, errors.New("client: a durable name is needed, so events are not lost between runs")
	}
	cons, err := c.js.CreateOrUpdateConsumer(ctx, c.opts.Stream, jetstream.ConsumerConfig{
		Durable:       durable,
		FilterSubject: c.opts.Prefix + ".timer." + queue,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverNewPolicy,
		AckWait:       30 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("client: consumer %s: %w", durable, err)
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var ev Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			_ = m.Term() // not a timer event: never deliverable
			return
		}
		if err := handler(hctx, ev); err != nil {
			_ = m.NakWithDelay(RetryDelay)
			return
		}
		_ = m.Ack()
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("client: consume %s: %w", durable, err)
	}
	return &Subscription{cc: cc, cancel: cancel}, nil
}
