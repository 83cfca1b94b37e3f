package ingest

import (
	"context"
	"log/slog"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nuid"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/ratelog"
)

// deadLetters is the stage that forwards input ingest refused to the
// dead-letter subject (docs/guarantees.md, guarantee 9). A refused message is acked
// at once and only a copy of what the event needs is queued: bad input
// never holds a slot of the broker's in-flight window, which good input
// needs, however long NATS is down. Forwarding is best effort: the queue
// is bounded and, when full, drops its oldest refusal (counted in
// invalid_unforwarded_total, logged at a limited rate). The source is its
// only sender and ends the input with close.
type deadLetters struct {
	pub    *dispatch.Bus // nil: refusals are counted and logged only
	log    *slog.Logger
	m      *metrics
	logLim *ratelog.Limiter

	// mu orders refuse against close: refuse holds it shared while it
	// hands a refusal over, close takes it to set closed and close queue.
	mu     sync.RWMutex
	closed bool
	queue  chan refusal
}

// refusal is a message ingest could not use, on its way to the dead-letter
// subject. It holds copies: the message itself is acked already.
type refusal struct {
	reason  string
	topic   string
	payload []byte // at most dispatch.MaxInvalidPayload+1 bytes, so truncation still shows
	at      int64  // unix ms
}

// invalidBatch bounds refusals published together.
const invalidBatch = 64

func newDeadLetters(pub *dispatch.Bus, m *metrics, log *slog.Logger) *deadLetters {
	return &deadLetters{
		pub:    pub,
		log:    log,
		m:      m,
		logLim: ratelog.New(time.Second, nil),
		queue:  make(chan refusal, invalidQueue),
	}
}

// refuse counts, logs (at a limited rate) and acks a message, and queues a
// copy for the dead-letter subject. It never waits: when the queue is full
// the oldest refusal in it is dropped.
func (d *deadLetters) refuse(err error, topic string, m mqtt.Message, now time.Time) {
	reason := reasonOf(err)
	d.m.invalid[reason].Inc()
	d.logLim.Warn(d.log, "refused", "refused invalid message", "reason", reason, "topic", topic, "err", err)
	p := m.Payload()
	r := refusal{reason: reason, topic: topic, payload: append([]byte(nil), p[:min(len(p), dispatch.MaxInvalidPayload+1)]...), at: now.UnixMilli()}
	m.Ack()
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		d.m.unforwarded.Inc()
		return
	}
	for {
		select {
		case d.queue <- r:
			return
		default:
		}
		select {
		case <-d.queue:
			d.m.unforwarded.Inc()
			d.logLim.Warn(d.log, "unforwarded", "dead-letter queue full; dropping the oldest refusal (is NATS reachable?)")
		default:
		}
	}
}

// close ends the input; refusals after it are acked and counted, not
// forwarded.
func (d *deadLetters) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	close(d.queue)
}

// run publishes refusals to the dead-letter subject, in batches, until the queue is closed and drained. ctx bounds the publishes.
func (d *deadLetters) run(ctx context.Context) {
	batch := make([]refusal, 0, invalidBatch)
	for r := range d.queue {
		batch = append(batch[:0], r)
	more:
		for len(batch) < invalidBatch {
			select {
			case r, ok := <-d.queue:
				if !ok {
					break more
				}
				batch = append(batch, r)
			default:
				break more
			}
		}
		d.forward(ctx, batch)
	}
}

func (d *deadLetters) forward(ctx context.Context, batch []refusal) {
	if d.pub != nil {
		msgs := make([]dispatch.Message, 0, len(batch))
		for _, r := range batch {
			ev := dispatch.NewInvalid(nuid.Next(), r.reason, r.topic, r.payload, r.at)
			msg, err := dispatch.Encode(d.pub.Subjects(), ev)
			if err != nil {
				d.log.Error("encode invalid event", "err", err)
				continue
			}
			msgs = append(msgs, msg)
		}
		failed := 0
		var last error
		for _, err := range publishEvents(ctx, d.pub, msgs) {
			if err != nil {
				failed, last = failed+1, err
			}
		}
		if failed > 0 {
			d.m.unforwarded.Add(float64(failed))
			d.log.Error("invalid messages not forwarded to the dead-letter subject", "count", failed, "err", last)
		}
	}
}
