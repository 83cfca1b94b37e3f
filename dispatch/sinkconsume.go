package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SinkFailed is the subject of the notifications sink name gave up on:
// the sink refused them, or did not take them within its retry budget.
func (s Subjects) SinkFailed(name string) string { return s.prefix() + ".sink.failed." + name }

// SinkFailure is the body of a message on SinkFailed: the notification as
// it was published (Event, its subject and id), and why it was not
// delivered.
type SinkFailure struct {
	ID       string `json:"id"`
	Sink     string `json:"sink"`
	Subject  string `json:"subject"`
	EventID  string `json:"event_id"`
	Error    string `json:"error"`
	Attempts int    `json:"attempts"`
	At       int64  `json:"at"`
	Event    []byte `json:"event"`
}

func (ev SinkFailure) subject(s Subjects) string { return s.SinkFailed(ev.Sink) }
func (ev SinkFailure) msgID() string             { return ev.ID }

// SinkConsumer is the durable consumer of one sink: the alarm
// notifications and storm events, one at a time across every replica, so
// that a sink gets them in the order they were published and an alarm's
// resolve never overtakes its raise.
type SinkConsumer struct {
	p    *Bus
	name string
	wait time.Duration
	cons jetstream.Consumer
}

// SinkMsg is one notification a sink consumer holds.
type SinkMsg struct {
	msg jetstream.Msg
	// Subject and ID (its Nats-Msg-Id) say what it is; Data is its body.
	Subject, ID string
	Data        []byte
	// Delivered counts its deliveries, this one included.
	Delivered uint64
	// Published is when it was stored.
	Published time.Time
}

// Ack says the notification is done with: delivered, or given up on.
func (m SinkMsg) Ack() error { return m.msg.DoubleAck(context.Background()) }

// Working keeps the notification with this replica a while longer: the
// sink is being retried.
func (m SinkMsg) Working() error { return m.msg.InProgress() }

// Release hands the notification back to be delivered again at once (this
// replica is stopping).
func (m SinkMsg) Release() error { return m.msg.Nak() }

// Drop ends a notification that cannot be read.
func (m SinkMsg) Drop() error { return m.msg.Term() }

// NewSinkConsumer creates (or updates) the durable consumer of sink name
// ("sigwatch-sink-<name>"). A new consumer starts with the notifications
// published from then on. wait is how long a replica that holds a
// notification without a word keeps it before another gets it.
func (p *Bus) NewSinkConsumer(ctx context.Context, name string, wait time.Duration) (*SinkConsumer, error) {
	if p.opts.Mode != JetStream {
		return nil, errors.New("dispatch: sinks need nats.mode jetstream")
	}
	c := &SinkConsumer{p: p, name: name, wait: wait}
	cons, err := p.js.CreateOrUpdateConsumer(ctx, p.opts.Stream, jetstream.ConsumerConfig{
		Durable:        "sigwatch-sink-" + name,
		Description:    "sigwatch sink " + name + ": alarm notifications and storm events",
		FilterSubjects: []string{p.subjects.prefix() + ".alarm.>", p.subjects.Storm()},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        wait,
		MaxDeliver:     -1,
		MaxAckPending:  1,
	})
	if err != nil {
		return nil, fmt.Errorf("dispatch: consumer of sink %s on stream %s: %w", name, p.opts.Stream, err)
	}
	c.cons = cons
	return c, nil
}

// Next waits for the sink's next notification, until ctx ends.
func (c *SinkConsumer) Next(ctx context.Context) (SinkMsg, error) {
	for {
		if err := ctx.Err(); err != nil {
			return SinkMsg{}, err
		}
		batch, err := c.cons.Fetch(1, jetstream.FetchMaxWait(min(time.Second, c.wait)))
		if err != nil {
			if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				return SinkMsg{}, fmt.Errorf("dispatch: consumer of sink %s: %w", c.name, err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for msg := range batch.Messages() {
			m := SinkMsg{msg: msg, Subject: msg.Subject(), ID: msg.Headers().Get(jetstream.MsgIDHeader), Data: msg.Data()}
			if md, err := msg.Metadata(); err == nil {
				m.Delivered, m.Published = md.NumDelivered, md.Timestamp
			}
			return m, nil
		}
	}
}

// Pending is how many notifications wait for the sink, the one in hand
// included.
func (c *SinkConsumer) Pending(ctx context.Context) (int64, error) {
	info, err := c.cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int64(info.NumPending) + int64(info.NumAckPending), nil
}
