package ingest

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// want makes the probe loop probe at once and at its full rate for
// fastHold: a scanner waits for the watermark.
func (s *source) want() {
	s.fastUntil.Store(time.Now().Add(fastHold).UnixNano())
	select {
	case s.wanted <- struct{}{}:
	default:
	}
}

// probeLoop probes every ProbeInterval while a scanner wants the
// watermark, and every IdleProbeInterval otherwise, until ctx is done.
func (s *source) probeLoop(ctx context.Context, probe func()) {
	// A process that starts catches up at the full rate.
	s.fastUntil.Store(time.Now().Add(fastHold).UnixNano())
	t := time.NewTimer(s.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.wanted:
		}
		probe()
		next := s.opts.IdleProbeInterval
		if time.Now().UnixNano() < s.fastUntil.Load() {
			next = s.opts.ProbeInterval
		}
		t.Reset(next)
	}
}

// probe publishes the probes carrying their send time on the probe
// connection p, if both it and the subscriber's connection c are up. The
// broker queues each probe to c's session behind every message it routed
// to the same subscription before the probe arrived, so the send time
// still bounds them. The tokens are not awaited: a probe that never comes
// back simply does not advance the watermark. buf is scratch space,
// returned for reuse.
func (s *source) probe(c, p mqtt.Client, buf []byte) []byte {
	if !c.IsConnectionOpen() || s.connectedAt.Load() == 0 || !p.IsConnectionOpen() {
		s.answers.forget()
		return buf
	}
	s.answers.sent(time.Now())
	buf, _, _ = s.sendProbe(p, buf)
	return buf
}

// sendProbe publishes on client one probe on each probe topic, all with
// the same time, and returns that time and the last probe's token (with
// one probe topic, as in handOver, the token of the one probe); handOver's
// last probe is made the same way as the periodic ones.
func (s *source) sendProbe(client mqtt.Client, buf []byte) ([]byte, int64, mqtt.Token) {
	ms := s.opts.Now().UnixMilli()
	buf = strconv.AppendInt(buf[:0], ms, 10)
	var tok mqtt.Token
	for _, topic := range s.opts.probes {
		// paho keeps the payload slice, so each probe gets its own.
		tok = client.Publish(topic, 1, false, append([]byte(nil), buf...))
	}
	return buf, ms, tok
}

// probeOptions configures the probe connection: it only publishes, with a
// clean session, as ClientID + "-probe".
func (s *source) probeOptions() *mqtt.ClientOptions {
	return s.connOptions(s.opts.ClientID + "-probe").SetCleanSession(true)
}

// onProbe records a returned probe, sent on probe topic k (see
// Options.probes), and passes the earliest time for which every probe
// topic's probe is back to the pipeline as a barrier, when it rises: a
// signal on any filter that reached the broker before that time has been
// received. A probe counts only if it was sent on the current connection:
// one sent before a disconnection (and resent after it, or left over in
// the session) says nothing about the time in between.
func (s *source) onProbe(k int, m mqtt.Message) {
	m.Ack()
	ms, err := strconv.ParseInt(string(m.Payload()), 10, 64)
	if err != nil || ms <= 0 {
		return
	}
	since := s.connectedAt.Load()
	b := &s.back
	b.Lock()
	b.any[k] = max(b.any[k], ms)
	// Whatever connection they were sent on, the probes were sent by then:
	// what comes after them reached the broker later.
	ev := slices.Min(b.any)
	if ms >= since {
		b.current[k] = max(b.current[k], ms)
	}
	barrier := slices.Min(b.current)
	if barrier < since || barrier <= b.barrier {
		barrier = 0
	} else {
		b.barrier = barrier
	}
	b.Unlock()
	if ev > 0 {
		s.raiseEvidence(ev)
	}
	if barrier > 0 {
		s.answers.handOver()
		s.pipe.enqueueBarrier(barrier)
		s.answers.handedOver()
	}
}

// probeID reports whether the id level of topic holds a probe's id
// (ProbeTopicUnder): another member's probe, not a device.
func (s *source) probeID(topic string) bool {
	levels := strings.Split(topic, "/")
	return s.opts.IDLevel < len(levels) && strings.HasPrefix(levels[s.opts.IDLevel], ProbeIDPrefix)
}
