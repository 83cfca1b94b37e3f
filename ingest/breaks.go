package ingest

import (
	"sync"
	"time"
)

// breaks keeps the breaks of the subscriber's connection until the
// watermark stage has reported them as an outage (docs/guarantees.md, guarantee 6).
// Losing the broker is an outage from the moment the connection is lost,
// whatever its length: devices cannot publish while the broker is down,
// and the broker may have dropped what it held. After a broker restart the
// devices must reconnect too, with their own back-off, so the outage then
// runs on for the reconnect grace after the connection is back; a
// connection of our own that dropped while the broker kept running (it
// kept the devices' messages, and the devices their connections) gets no
// grace.
//
// A reconnection is taken for a broker restart unless the broker shows
// otherwise: it is the broker of the lost connection, and its uptime
// ($SYS/broker/uptime, which Mosquitto publishes retained) says it started
// before the connection was lost. A broker that does not say (the NATS
// MQTT listener, a cluster) gets the grace: a silent device is then
// reported a grace later, never a live one falsely.
//
// lose runs before each reconnection attempt (paho's reconnecting
// handler) and connected once the new connection is subscribed, always in
// that order; the time the loss was noticed may come from paho's
// connection-lost callback, which runs on a goroutine of its own.
type breaks struct {
	grace time.Duration
	m     *metrics

	mu   sync.Mutex
	down bool // the connection is lost and not yet subscribed again
	// lastLost is when a loss was last noticed, back when the connection
	// was last subscribed again.
	lastLost, back int64
	// broker is the broker of the latest connection attempt, lostBroker
	// that of the connection lost.
	broker, lostBroker string
	// started is the latest start time of the broker its uptime shows, on
	// the connection since the loss (0: not shown).
	started int64
	// since is when the first break not yet reported began (0: none); end
	// is how far its outage reaches so far, and graceFrom when the latest
	// grace in it began (0: none).
	since, end, graceFrom int64
	// judging: the latest reconnection, of the break that began at lostAt,
	// awaits the broker's uptime.
	judging bool
	lostAt  int64
	gen     uint64 // counts changes, so that a report clears only what it saw
}

// noticed records that the connection was seen lost at now.
func (b *breaks) noticed(now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastLost = now
}

// lastLoss returns when the connection was last seen lost (0: never).
func (b *breaks) lastLoss() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(b.lastLost, b.lostAt)
}

// lose records, before a reconnection attempt at now, that the connection
// is lost.
func (b *breaks) lose(now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return
	}
	at := now
	if b.lastLost > b.back {
		at = min(at, b.lastLost)
	}
	b.down, b.lostAt, b.lostBroker, b.started, b.judging = true, at, b.broker, 0, false
	if b.since == 0 {
		b.since = at
	}
	b.gen++
}

// attempt records the broker of a connection attempt; the last one before
// a connection succeeds is the broker connected to.
func (b *breaks) attempt(broker string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.broker = broker
}

// current is the broker of the latest connection attempt.
func (b *breaks) current() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.broker
}

// connected records that the connection is subscribed again at now.
func (b *breaks) connected(now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.back = now
	if !b.down {
		return
	}
	b.down, b.judging = false, true
	b.end = max(b.end, now)
	b.gen++
	b.m.brokerOutages.Inc()
	if b.started != 0 {
		b.judgeLocked()
	}
}

// uptime records the broker's uptime in seconds, read at now: the broker
// started no later than now-uptime.
func (b *breaks) uptime(now, seconds int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.started = now - seconds*1000
	if b.judging {
		b.judgeLocked()
	}
}

// judgeLocked decides whether the broker restarted in the latest break: not
// if it is the same broker and started before the connection was lost. The
// caller holds mu.
func (b *breaks) judgeLocked() {
	if b.broker != b.lostBroker || b.started >= b.lostAt {
		b.graceLocked()
	}
	b.judging = false
	b.gen++
}

// graceLocked extends the outage by the grace after the latest
// reconnection; the caller holds mu.
func (b *breaks) graceLocked() {
	b.end = max(b.end, b.back+b.grace.Milliseconds())
	b.graceFrom = b.back
	b.m.reconnectGraces.Inc()
}

// report returns the outage the watermark stage records with its report
// at ms (a probe's time): its end (0: none) and when its grace began (0:
// none). A reconnection whose broker has not shown by then that it kept
// running gets the grace. gen is handed back to reported.
func (b *breaks) report(ms int64) (end, graceFrom int64, gen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.since == 0 || ms < b.since {
		return 0, 0, b.gen
	}
	if b.judging && ms >= b.back {
		b.graceLocked()
		b.judging = false
		b.gen++
	}
	return max(b.end, ms), b.graceFrom, b.gen
}

// reported records that the outage report returned was stored: once the
// connection is back and judged, the breaks so far are done with.
func (b *breaks) reported(gen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if gen != b.gen || b.down || b.judging {
		return
	}
	b.since, b.end, b.graceFrom = 0, 0, 0
}
