package ingest

import (
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nuid"

	"github.com/sigwatch/sigwatch/dispatch"
)

// refusal is a message ingest could not use, on its way to the dead-letter
// subject.
type refusal struct {
	reason string
	topic  string
	msg    mqtt.Message
	at     int64 // unix ms
}

// invalidBatch bounds refusals published together.
const invalidBatch = 64

// refuse counts, logs (at a limited rate) and queues a message for the
// dead-letter subject; the forwarder acks it once published. It never
// waits: when the queue is full the message is acked unforwarded.
func (in *Ingest) refuse(err error, topic string, m mqtt.Message, now time.Time) {
	reason := reasonOf(err)
	in.m.invalid[reason].Inc()
	if ok, suppressed := in.invalidLog.allow(now); ok {
		in.log.Warn("refused invalid message", "reason", reason, "topic", topic, "err", err, "suppressed", suppressed)
	}
	in.gate.RLock()
	defer in.gate.RUnlock()
	if in.closed {
		return // unacked: delivered again to the next session
	}
	select {
	case in.invalid <- refusal{reason: reason, topic: topic, msg: m, at: now.UnixMilli()}:
	default:
		in.m.unforwarded.Inc()
		m.Ack()
	}
}

// forwardInvalid publishes refusals to the dead-letter subject and acks
// them, until the queue is closed and drained.
func (in *Ingest) forwardInvalid() {
	batch := make([]refusal, 0, invalidBatch)
	for r := range in.invalid {
		batch = append(batch[:0], r)
	more:
		for len(batch) < invalidBatch {
			select {
			case r, ok := <-in.invalid:
				if !ok {
					break more
				}
				batch = append(batch, r)
			default:
				break more
			}
		}
		in.forward(batch)
	}
}

func (in *Ingest) forward(batch []refusal) {
	if in.pub != nil {
		msgs := make([]dispatch.Message, 0, len(batch))
		for _, r := range batch {
			ev := dispatch.NewInvalid(nuid.Next(), r.reason, r.topic, r.msg.Payload(), r.at)
			msg, err := dispatch.Encode(in.pub.Subjects.Invalid(), ev.ID, ev)
			if err != nil {
				in.log.Error("encode invalid event", "err", err)
				continue
			}
			msgs = append(msgs, msg)
		}
		failed := 0
		var last error
		for _, err := range in.publish(in.storeCtx, msgs) {
			if err != nil {
				failed, last = failed+1, err
			}
		}
		if failed > 0 {
			in.m.unforwarded.Add(float64(failed))
			in.log.Error("invalid messages not forwarded to the dead-letter subject", "count", failed, "err", last)
		}
	}
	for _, r := range batch {
		r.msg.Ack()
	}
}
