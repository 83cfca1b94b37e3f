package ingest

import (
	"fmt"
	"sync/atomic"
	"time"
)

// brokerSilence is how long the broker may leave this member's probes
// unanswered, and deliver nothing else, before readiness says it is not
// answering. paho notices a frozen broker only when a keep-alive ping goes
// unanswered, 15-35s late; the probes, sent every idle probe interval
// (250ms), see it sooner. It stays above outage_after's default (3s), so
// that readiness does not flap where the watermark records a short outage.
const brokerSilence = 5 * time.Second

// answers tracks whether the broker answers this member: since the oldest
// probe still unanswered was sent, has anything come from the broker?
type answers struct {
	// waiting is when (unix ns) the oldest probe sent since the broker last
	// delivered anything was sent; 0 when there is none.
	waiting atomic.Int64
	// handing is set while the handler hands a message over to the
	// pipeline, which waits when the pipeline is full (Redis slow or down):
	// paho reads nothing meanwhile, so the probes wait in the connection
	// for ingest, not for the broker.
	handing atomic.Bool
}

// sent records a probe sent at now.
func (a *answers) sent(now time.Time) { a.waiting.CompareAndSwap(0, now.UnixNano()) }

// heard records that the broker delivered something: a probe or a signal.
// It runs for every message, so it writes only when a probe was waiting.
func (a *answers) heard() {
	if a.waiting.Load() != 0 {
		a.waiting.Store(0)
	}
}

// handOver runs before the handler hands a message over, handedOver
// after: what is read next is as good as heard now.
func (a *answers) handOver() { a.handing.Store(true) }

func (a *answers) handedOver() {
	a.handing.Store(false)
	a.heard()
}

// forget drops what was waiting: the connection is down, which readiness
// reports on its own.
func (a *answers) forget() { a.waiting.Store(0) }

// silentFor is how long the broker has left a probe unanswered, 0 if it
// answers or ingest is not reading.
func (a *answers) silentFor(now time.Time) time.Duration {
	w := a.waiting.Load()
	if w == 0 || a.handing.Load() {
		return 0
	}
	return max(now.Sub(time.Unix(0, w)), 0)
}

// Answering reports whether the broker answers ingest: it says why not
// (naming the broker) once the probes this member sends to itself have gone
// unanswered for brokerSilence, with nothing else delivered meanwhile. A
// member whose pipeline is full (its signals waiting for Redis) reads
// nothing from the broker, so it is not judged then. Without brokers, or
// while not connected (see Connected), it reports true.
func (in *Ingest) Answering() (bool, string) {
	s := in.src
	if len(s.opts.Brokers) == 0 || !s.connected() {
		return true, ""
	}
	d := s.answers.silentFor(time.Now())
	if d < brokerSilence {
		return true, ""
	}
	return false, fmt.Sprintf("the broker %s has not answered the probes for %s", s.breaks.current(), d.Round(time.Second))
}
