package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"golang.org/x/sync/errgroup"

	"github.com/sigwatch/sigwatch/internal/backoff"
	"github.com/sigwatch/sigwatch/internal/periodic"
	"github.com/sigwatch/sigwatch/internal/ratelog"
	"github.com/sigwatch/sigwatch/internal/sparkplug"
	"github.com/sigwatch/sigwatch/shard"
)

// source is the stage where signals come in: the MQTT subscription. paho
// calls onMessage for one message at a time; the source parses it and hands
// a signal to the pipeline, or a refusal to the dead letters. It also
// publishes the watermark probes to itself and hands each one that comes
// back to the pipeline as a barrier. Without brokers it has no connection,
// and sends a barrier every probe interval instead (signals then come only
// through Signal, which is synchronous).
//
// run ends when its context does; the client stays connected until
// disconnect, so that the acks of what is in flight still go out.
type source struct {
	opts    *Options
	log     *slog.Logger
	pipe    *pipeline
	dead    *deadLetters
	breaks  *breaks
	connLog *ratelog.Limiter

	client      atomic.Pointer[mqtt.Client]
	prober      atomic.Pointer[mqtt.Client] // publishes the probes
	connectedAt atomic.Int64                // unix ms when the current connection was subscribed; 0 before
	// shortLived counts the connections in a row the broker closed soon
	// after they opened; takenOverSaid is set once that was logged.
	shortLived    atomic.Int32
	takenOverSaid atomic.Bool
	// evidence is the send time, unix ms, of the latest probe this process
	// received (on any of its connections) on every probe topic: the broker
	// delivers a subscription's messages in order (see onConnect), so a
	// signal received after that probe reached the broker no earlier. Before the first
	// probes it is this member's stored watermark (see seed), or 0: nothing
	// is known.
	evidence atomic.Int64
	// back holds, per probe topic (Options.probes), the send times of the
	// latest probe that came back, and barrier the last barrier handed to
	// the pipeline.
	back struct {
		sync.Mutex
		any     []int64 // on any connection
		current []int64 // sent on the current connection
		barrier int64
	}
	// refused receives why the broker cannot carry the probes soundly;
	// run then returns it.
	refused chan error
	// fastUntil is when the full probe rate ends (unix ns): a scanner asked
	// for the watermark (want); wanted wakes the probe loop for it.
	fastUntil atomic.Int64
	wanted    chan struct{}
	// stampFrom is what stamps are capped from while there is no evidence:
	// the global watermark, or the start time.
	stampFrom atomic.Int64
	// brokerDropped is the broker's own count of messages it dropped
	// (Mosquitto's $SYS/broker/publish/messages/dropped), -1 if unknown.
	brokerDropped atomic.Int64
	// dropBase is the broker's count at its last report on this
	// connection, -1 before the first; droppedSeen sums the increases from
	// one report to the next, so drops from before this process connected,
	// or before a broker restart reset the count, are never counted.
	dropBase, droppedSeen atomic.Int64
	// join records this member in its shared group's watermark before it
	// subscribes (set by New; nil without a group).
	join func(ctx context.Context, ms int64) error
	// leaving is set once handOver began: a reconnection then subscribes
	// the probe topic only, so that the broker routes no more signals here.
	leaving atomic.Bool
	// answers says whether the broker answers the probes (readiness).
	answers answers
	// rates caches Sparkplug nodes' scan rates (node -> nodeRate).
	rates sync.Map
}

func newSource(opts *Options, pipe *pipeline, dead *deadLetters, br *breaks, log *slog.Logger) *source {
	s := &source{opts: opts, log: log, pipe: pipe, dead: dead, breaks: br, connLog: ratelog.New(time.Minute, opts.Now),
		refused: make(chan error, 1), wanted: make(chan struct{}, 1)}
	s.brokerDropped.Store(-1)
	s.dropBase.Store(-1)
	s.back.any = make([]int64, len(opts.probes))
	s.back.current = make([]int64, len(opts.probes))
	return s
}

// run connects and subscribes, then probes until ctx ends; it returns
// early, with an error, if the connection is refused for good. Without
// brokers it sends barriers until ctx ends.
func (s *source) run(ctx context.Context) error {
	if len(s.opts.Brokers) == 0 {
		// Barriers and probes carry the injected clock's time, not the tick's.
		periodic.Run(ctx, s.opts.ProbeInterval, func(time.Time) { s.pipe.enqueueBarrier(s.opts.Now().UnixMilli()) })
		return nil
	}
	c := newClient(s.clientOptions(), s.opts.Protocol)
	s.client.Store(&c)
	tok := c.Connect()
	// A refused connection ends the probing with it, and so does a broker
	// that cannot carry the probes soundly.
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		select {
		case <-tok.Done():
			if err := tok.Error(); err != nil {
				return fmt.Errorf("ingest: connect to %v: %w", s.opts.Brokers, err)
			}
		case <-gctx.Done():
			return nil
		}
		select {
		case err := <-s.refused:
			return err
		case <-gctx.Done():
			return nil
		}
	})
	// Probes go out on a connection of their own: on the subscriber's
	// connection they would queue behind its acks, which the broker may
	// read far slower than it delivers (Mosquitto reads one packet per
	// connection per turn of its loop), and the watermark would lag seconds
	// behind what is stored, and stay behind while the load lasts.
	p := mqtt.NewClient(s.probeOptions())
	s.prober.Store(&p)
	p.Connect()
	g.Go(func() error {
		var buf []byte
		s.probeLoop(gctx, func() { buf = s.probe(c, p, buf) })
		return nil
	})
	return g.Wait()
}

// handOver ends this member's share of a shared subscription without
// losing what the broker already routed to it. Mosquitto drops the messages
// of a clean session that disconnects, even those delivered and unacked;
// after an UNSUBSCRIBE it routes nothing more here but still delivers, in
// order, what it had routed before (TestSharedMemberLeaving). So handOver
// unsubscribes the device filters and then publishes one probe: once that
// probe's barrier passes (the caller waits for it), every signal routed
// here is stored. It returns the probe's time, or false if the connection
// is not up or the broker did not answer within wait.
func (s *source) handOver(wait time.Duration) (int64, bool) {
	s.leaving.Store(true)
	cp := s.client.Load()
	if cp == nil || !(*cp).IsConnectionOpen() || s.connectedAt.Load() == 0 {
		return 0, false
	}
	c := *cp
	deadline := time.Now().Add(wait)
	tok := c.Unsubscribe(s.deviceFilters()...)
	if !tok.WaitTimeout(wait) || tok.Error() != nil {
		s.log.Warn("unsubscribe failed while stopping; staying in the group until the member timeout", "err", tok.Error())
		return 0, false
	}
	_, ms, ptok := s.sendProbe(c, nil)
	if !ptok.WaitTimeout(time.Until(deadline)) || ptok.Error() != nil {
		s.log.Warn("last probe not sent while stopping; staying in the group until the member timeout", "err", ptok.Error())
		return 0, false
	}
	return ms, true
}

// deviceFilters are the filters signals come in on, shared if this member
// is in a group.
func (s *source) deviceFilters() []string {
	fs := slices.Concat(s.opts.Topics, s.opts.Status.Topics, s.opts.Connections.Topics)
	if s.opts.Sparkplug.Enabled {
		fs = append(fs, sparkplugFilter)
	}
	out := make([]string, 0, len(fs))
	for _, f := range fs {
		if s.opts.SharedGroup != "" {
			f = "$share/" + s.opts.SharedGroup + "/" + f
		}
		out = append(out, f)
	}
	return out
}

// disconnect ends the connection, once what is in flight was acked.
func (s *source) disconnect() {
	if p := s.prober.Load(); p != nil {
		(*p).Disconnect(0)
	}
	if c := s.client.Load(); c != nil {
		// Acks were handed to paho before this, so they go out before the
		// DISCONNECT.
		(*c).Disconnect(250)
	}
}

// onMessage handles one message from the broker. It is called by paho's
// router, one message at a time.
func (s *source) onMessage(_ mqtt.Client, m mqtt.Message) {
	s.answers.heard()
	if m.Retained() {
		// The broker replays retained messages on every subscription, and
		// ingest resubscribes on every connection: a replay is old news,
		// and counting it would keep a dead device alive.
		m.Ack()
		return
	}
	topic := m.Topic()
	switch topic {
	case sysDropped:
		s.onDropped(nil, m)
		return
	case sysUptime:
		s.onUptime(nil, m)
		return
	}
	if k := s.opts.probeIndex(topic); k >= 0 {
		s.onProbe(k, m)
		return
	}
	now := s.opts.Now()
	if s.opts.Sparkplug.Enabled && strings.HasPrefix(topic, sparkplug.Namespace+"/") {
		s.onSparkplug(m, now, s.stampCap(now))
		return
	}
	if len(s.opts.Connections.Topics) > 0 && s.opts.connTopic(topic) {
		s.onConnEvent(m, now, s.stampCap(now))
		return
	}
	status := len(s.opts.Status.Topics) > 0 && s.opts.statusTopic(topic)
	var id, typ, group string
	var err error
	if status {
		id, typ, _, err = ParseTopic(topic, s.opts.Status.IDLevel, s.opts.Status.TypeLevel, -1, s.opts.MaxIDLen)
	} else {
		id, typ, group, err = ParseTopic(topic, s.opts.IDLevel, s.opts.TypeLevel, *s.opts.GroupLevel, s.opts.MaxIDLen)
	}
	if errors.Is(err, ErrReservedID) && s.probeID(topic) {
		m.Ack() // another member's probe (ProbeTopicUnder), not a device
		return
	}
	ev := s.evidence.Load()
	hi := s.stampCap(now)
	at := hi
	var (
		online = true
		decl   Declared
	)
	switch {
	case err != nil:
	case status:
		// A report is timed by its receipt: a will carries no time of
		// its own.
		online, err = ParseStatus(m.Payload(), &s.opts.Status)
	default:
		if s.opts.TimestampMode == TimestampPayload {
			var ts time.Time
			if ts, err = ParseTimestamp(m.Payload()); err == nil {
				at = clampTo(ts, now.Add(-s.opts.MaxSkew), hi)
			}
		}
		if err == nil {
			decl, err = ParseDeclared(m.Payload())
		}
		if p, ok := m.(*message5); ok && err == nil && !decl.Set {
			decl, err = ParseDeclaredProperties(p.userProperty)
		}
	}
	if err != nil {
		s.dead.refuse(err, topic, m, now)
		return
	}
	// A redelivery (DUP) was first delivered before the connection was last
	// lost, if it was since: it is stamped no later. A broker that keeps a
	// session's messages in a stream (the NATS MQTT listener) redelivers
	// what was unacked when the connection broke an ack wait later, behind
	// newer probes, so the probes are no evidence of when it had it.
	dup := m.Duplicate()
	if dup {
		if l := s.breaks.lastLoss(); l > 0 && l < at.UnixMilli() {
			at = time.UnixMilli(l)
		}
	}
	sig := s.pipe.signal(id, typ, group, at, m, nil)
	if !online {
		sig.lower = shard.ReasonWill
	}
	if s.pipe.declare(&sig, decl) {
		s.pipe.m.clamped.Inc()
	}
	// A device's own older time is weaker evidence, and is what it is
	// judged by. Without evidence, nothing shows the signal is newer than
	// any loss: a redelivery brings no lost device back.
	sig.lo = min(ev, sig.at)
	if dup {
		sig.lo = 0
	}
	// An error means ingest is stopping: the message stays unacked. A
	// persistent session gets it again next run; a clean (shared) one loses
	// it, so the member then stays in its group's watermark.
	s.answers.handOver()
	_ = s.pipe.enqueue(context.Background(), sig)
	s.answers.handedOver()
}

// stampCap is the latest a message received at now may be stamped: a
// signal is never stamped later than an outage threshold past the
// evidence of when the broker had it, so a backlog delivered late (a
// stalled process, a slow consumer) is not taken for fresh signals. The
// cap is below the receive time only when this process's probes came back
// more than OutageAfter apart: its own watermark then jumps by as much,
// which its shared group records as an outage, and without a group another
// member covers the gap. So the cap never makes a device fire early.
func (s *source) stampCap(now time.Time) time.Time {
	from := time.UnixMilli(max(s.evidence.Load(), s.stampFrom.Load()))
	if from.UnixMilli() == 0 {
		return now // never seeded: Run is stopping
	}
	if c := from.Add(s.opts.OutageAfter); c.Before(now) {
		return c
	}
	return now
}

// cleanSession reports whether ingest connects with a clean session: one
// that holds nothing from before the connection.
func cleanSession(o *Options) bool { return o.SharedGroup != "" }

// seed sets what signals received before this process's first probe
// comes back (a session's backlog) are judged by, before it connects.
// This member's watermark stored in Redis is evidence: everything its
// session delivered before the probe it stands for was stored, so what the
// session still holds reached the broker after that probe was sent. A clean
// session holds nothing from before it connects, so now is evidence; so is
// it when ingest never ran (no watermark): no device was declared lost.
// Otherwise (a persistent session whose member left or timed out) there is
// no evidence, and a backlog may be older than any loss; stamps are then
// capped from the global watermark. It retries until Redis answers or ctx
// ends.
func (s *source) seed(ctx context.Context, store *shard.Store, member shard.Member) {
	for attempt := 0; ; attempt++ {
		own, global, err := seedWatermarks(ctx, store, member)
		if err == nil {
			now := s.opts.Now().UnixMilli()
			if cleanSession(s.opts) || own == 0 && global == 0 {
				own = now
			}
			s.raiseEvidence(own)
			s.stampFrom.Store(cmp.Or(own, global, now))
			return
		}
		s.log.Warn("reading the ingest watermarks failed; retrying", "err", err, "attempt", attempt+1)
		if !backoff.Wait(ctx, storeBackoff.Delay(attempt)) {
			return
		}
	}
}

// seedWatermarks reads member's stored watermark and the global one (0 when
// absent).
func seedWatermarks(ctx context.Context, store *shard.Store, member shard.Member) (own, global int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	members, err := store.Watermarks().Members(ctx)
	if err != nil {
		return 0, 0, err
	}
	// Members keys each member "group|id".
	own = max(members[member.Group+"|"+member.ID], 0)
	global, _, err = store.Watermarks().Read(ctx)
	return own, global, err
}

// raiseEvidence moves the evidence up to ms; it never moves back.
func (s *source) raiseEvidence(ms int64) {
	for {
		cur := s.evidence.Load()
		if ms <= cur || s.evidence.CompareAndSwap(cur, ms) {
			return
		}
	}
}
