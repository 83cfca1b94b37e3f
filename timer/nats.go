package timer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// flushEvery bounds how long a pulled reset waits for its batch to fill.
const flushEvery = 2 * time.Millisecond

// consume stores the resets published on sigwatch.timers.set.<queue> until
// ctx is done. A message is acknowledged only once every reset it holds is
// stored (or refused as malformed, and dead-lettered); one that cannot be
// stored is handed out again after a second. Should the consumer go away
// (its stream deleted, say), it is made again.
func (s *Service) consume(ctx context.Context) error {
	for {
		err := s.consumeOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		s.warnOnce("timer reset consumer stopped; starting it again", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// errConsumerClosed says the consumer stopped by itself.
var errConsumerClosed = errors.New("timer: reset consumer closed")

// consumeOnce runs one consumer until it stops or ctx is done.
func (s *Service) consumeOnce(ctx context.Context) error {
	cons, err := s.pub.TimerResets(ctx, s.opts.AckWait, 64*s.opts.Fetch)
	if err != nil {
		return err
	}
	in := make(chan jetstream.Msg, 4*s.opts.Fetch)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case in <- m:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(4*s.opts.Fetch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if ctx.Err() == nil && !errors.Is(err, jetstream.ErrNoHeartbeat) {
			s.warnOnce("timer reset consumer", err)
		}
	}))
	if err != nil {
		return err
	}
	defer cc.Stop()
	// Several batches are decoded and stored at once: decoding is CPU, a
	// store waits on Redis, and one at a time leaves both idle in turn.
	var wg sync.WaitGroup
	defer wg.Wait()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for range consumers {
		wg.Go(func() { s.storeBatches(wctx, in) })
	}
	select {
	case <-ctx.Done():
		return nil
	case <-cc.Closed():
		return errConsumerClosed
	}
}

// consumers is how many batches of resets one process stores at once.
const consumers = 4

// storeBatches stores the messages of in, batched, until ctx is done.
func (s *Service) storeBatches(ctx context.Context, in <-chan jetstream.Msg) {
	batches(ctx, in, s.opts.Fetch, s.storeMsgs)
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

// storeMsgs stores the resets of msgs as one batch and acknowledges them,
// or hands them back to be delivered again.
func (s *Service) storeMsgs(ctx context.Context, msgs []jetstream.Msg) {
	now := s.opts.Now()
	var (
		rs  []shard.TimerReset
		bad []dispatch.Message
	)
	prefix := strings.TrimSuffix(s.pub.Subjects().AllTimerSet(), ">")
	for _, m := range msgs {
		queue := strings.TrimPrefix(m.Subject(), prefix)
		reqs, err := decodeResets(m.Data())
		if err != nil {
			bad = append(bad, s.invalid(m, 0, "bad_json", err, now))
			continue
		}
		for j, r := range reqs {
			t, err := s.opts.Limits.Reset(queue, r.ID, r, now)
			if err != nil {
				bad = append(bad, s.invalid(m, j, reason(err), err, now))
				continue
			}
			rs = append(rs, t)
		}
	}
	if err := s.Reset(ctx, rs); err != nil {
		if ctx.Err() == nil {
			s.warnOnce("timer resets from NATS not stored; delivered again", err)
		}
		for _, m := range msgs {
			_ = m.NakWithDelay(time.Second)
		}
		return
	}
	s.Stored("nats", len(rs))
	if len(bad) > 0 {
		// Dead-lettered best effort: the resets beside them are stored.
		_ = s.pub.Publish(ctx, bad)
	}
	for _, m := range msgs {
		_ = m.Ack()
	}
}

// decodeResets reads one reset object or an array of them.
func decodeResets(b []byte) ([]Request, error) {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		var rs []Request
		err := json.Unmarshal(b, &rs)
		return rs, err
	}
	var r Request
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return []Request{r}, nil
}

// reason is the invalid event's reason for a refused reset.
func reason(err error) string {
	switch {
	case errors.Is(err, ErrBadQueue):
		return "bad_queue"
	case errors.Is(err, ErrBadPayload):
		return "bad_payload"
	}
	return "bad_timer"
}

// invalid is the dead-letter event of reset j of m, with an id from the
// message's stream sequence so that a redelivery is stored once.
func (s *Service) invalid(m jetstream.Msg, j int, why string, err error, now time.Time) dispatch.Message {
	s.m.invalid.WithLabelValues(why).Inc()
	id := "timers/" + strconv.Itoa(j)
	if md, merr := m.Metadata(); merr == nil {
		id = "timers/" + strconv.FormatUint(md.Sequence.Stream, 10) + "/" + strconv.Itoa(j)
	}
	ev := dispatch.NewInvalid(id, why+": "+err.Error(), m.Subject(), m.Data(), now.UnixMilli())
	msg, _ := dispatch.Encode(s.pub.Subjects().Invalid(), ev.ID, ev)
	return msg
}
