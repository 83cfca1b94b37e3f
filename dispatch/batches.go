package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Batching shapes how a consumer hands over what it receives: up to Size
// at once, Workers batches at a time.
type Batching struct {
	Size    int
	Workers int
	// Warn reports what stops or troubles the consumer (it is started
	// again); nil discards.
	Warn func(msg string, err error)
}

func (b Batching) warn(msg string, err error) {
	if b.Warn != nil {
		b.Warn(msg, err)
	}
}

// flushEvery bounds how long a received item waits for its batch to fill.
const flushEvery = 2 * time.Millisecond

// TimerMsg is one message of timer resets pulled from the reset stream.
type TimerMsg struct {
	Subject string
	Data    []byte
	msg     jetstream.Msg
}

// Seq is the message's stream sequence, the same on a redelivery; 0 if
// unknown. It is read only when asked for: most messages never need it.
func (m TimerMsg) Seq() uint64 {
	if md, err := m.msg.Metadata(); err == nil {
		return md.Sequence.Stream
	}
	return 0
}

// errConsumerClosed says the consumer stopped by itself.
var errConsumerClosed = errors.New("dispatch: timer reset consumer closed")

// ConsumeTimerResets hands the messages of the timer reset stream to
// handle in batches until ctx is done. The messages of a batch are
// acknowledged once handle returns nil, and handed out again after a second
// otherwise. Should the consumer go away (its stream deleted, say), it is
// made again.
func (p *Bus) ConsumeTimerResets(ctx context.Context, ackWait time.Duration, b Batching, handle func(context.Context, []TimerMsg) error) error {
	for {
		err := p.consumeTimerResetsOnce(ctx, ackWait, b, handle)
		if ctx.Err() != nil {
			return nil
		}
		b.warn("timer reset consumer stopped; starting it again", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// consumeTimerResetsOnce runs one consumer until it stops or ctx is done.
func (p *Bus) consumeTimerResetsOnce(ctx context.Context, ackWait time.Duration, b Batching, handle func(context.Context, []TimerMsg) error) error {
	cons, err := p.TimerResets(ctx, ackWait, 64*b.Size)
	if err != nil {
		return err
	}
	in := make(chan jetstream.Msg, 4*b.Size)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case in <- m:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(4*b.Size), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if ctx.Err() == nil && !errors.Is(err, jetstream.ErrNoHeartbeat) {
			b.warn("timer reset consumer", err)
		}
	}))
	if err != nil {
		return err
	}
	defer cc.Stop()
	// Several batches are handled at once: decoding is CPU, a store waits
	// on Redis, and one at a time leaves both idle in turn.
	var wg sync.WaitGroup
	defer wg.Wait()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for range max(1, b.Workers) {
		wg.Go(func() { batches(wctx, in, b.Size, settleAfter(handle)) })
	}
	select {
	case <-ctx.Done():
		return nil
	case <-cc.Closed():
		return errConsumerClosed
	}
}

// settleAfter runs handle on a batch of messages, then acknowledges them
// all, or, when handle failed, hands them back to be delivered again.
func settleAfter(handle func(context.Context, []TimerMsg) error) func(context.Context, []jetstream.Msg) {
	var tms []TimerMsg
	return func(ctx context.Context, msgs []jetstream.Msg) {
		tms = tms[:0]
		for _, m := range msgs {
			tms = append(tms, TimerMsg{Subject: m.Subject(), Data: m.Data(), msg: m})
		}
		if err := handle(ctx, tms); err != nil {
			for _, m := range msgs {
				_ = m.NakWithDelay(time.Second)
			}
			return
		}
		for _, m := range msgs {
			_ = m.Ack()
		}
	}
}

// batches hands what arrives on in to handle, up to max at a time, until
// ctx is done: a batch starts with the first item to arrive, takes what
// else is already there, and waits flushEvery for more.
func batches[T any](ctx context.Context, in <-chan T, max int, handle func(context.Context, []T)) {
	batch := make([]T, 0, max)
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-in:
			batch = append(batch[:0], m)
		}
		deadline := time.NewTimer(flushEvery)
	fill:
		for len(batch) < max {
			select {
			case m := <-in:
				batch = append(batch, m)
			case <-deadline.C:
				break fill
			}
		}
		deadline.Stop()
		handle(ctx, batch)
	}
}
