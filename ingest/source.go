package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/sigwatch/sigwatch/internal/periodic"
	"github.com/sigwatch/sigwatch/internal/ratelog"
	"golang.org/x/sync/errgroup"
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
	connLog *ratelog.Limiter

	client      atomic.Pointer[mqtt.Client]
	prober      atomic.Pointer[mqtt.Client] // publishes the probes
	connectedAt atomic.Int64                // unix ms when the current connection was subscribed; 0 before
	// brokerDropped is the broker's own count of messages it dropped
	// (Mosquitto's $SYS/broker/publish/messages/dropped), -1 if unknown.
	brokerDropped atomic.Int64
}

func newSource(opts *Options, pipe *pipeline, dead *deadLetters, log *slog.Logger) *source {
	s := &source{opts: opts, log: log, pipe: pipe, dead: dead, connLog: ratelog.New(time.Minute, opts.Now)}
	s.brokerDropped.Store(-1)
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
	c := mqtt.NewClient(s.clientOptions())
	s.client.Store(&c)
	tok := c.Connect()
	// A refused connection ends the probing with it.
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		select {
		case <-tok.Done():
			if err := tok.Error(); err != nil {
				return fmt.Errorf("ingest: connect to %v: %w", s.opts.Brokers, err)
			}
		case <-gctx.Done():
		}
		return nil
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
		periodic.Run(gctx, s.opts.ProbeInterval, func(time.Time) { buf = s.probe(c, p, buf) })
		return nil
	})
	return g.Wait()
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

// probe publishes a probe carrying its send time on the probe connection
// p, if both it and the subscriber's connection c are up. The broker
// queues the probe to c's session behind every message it routed there
// before the probe arrived, so the send time still bounds them. The token
// is not awaited: a probe that never comes back simply does not advance the
// watermark. buf is scratch space, returned for reuse.
func (s *source) probe(c, p mqtt.Client, buf []byte) []byte {
	if !c.IsConnectionOpen() || s.connectedAt.Load() == 0 || !p.IsConnectionOpen() {
		return buf
	}
	buf = strconv.AppendInt(buf[:0], s.opts.Now().UnixMilli(), 10)
	// paho keeps the payload slice, so each probe gets its own.
	p.Publish(s.opts.ProbeTopic, 1, false, append([]byte(nil), buf...))
	return buf
}

// probeOptions configures the probe connection: it only publishes, with a
// clean session, as ClientID + "-probe".
func (s *source) probeOptions() *mqtt.ClientOptions {
	o := mqtt.NewClientOptions()
	for _, b := range s.opts.Brokers {
		o.AddBroker(b)
	}
	o.SetClientID(s.opts.ClientID + "-probe").
		SetCleanSession(true).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(time.Second).
		SetMaxReconnectInterval(reconnectMax).
		SetWriteTimeout(5 * time.Second).
		SetKeepAlive(15 * time.Second)
	if s.opts.Username != "" {
		o.SetUsername(s.opts.Username)
		o.SetPassword(s.opts.Password)
	}
	if s.opts.TLS != nil {
		o.SetTLSConfig(s.opts.TLS)
	}
	return o
}

// connected reports whether the source is connected to the broker and has
// subscribed at least once. Without brokers it reports true.
func (s *source) connected() bool {
	if len(s.opts.Brokers) == 0 {
		return true
	}
	c := s.client.Load()
	return c != nil && (*c).IsConnectionOpen() && s.connectedAt.Load() != 0
}

// subscribeWait bounds how long a (re)subscription may take.
const subscribeWait = 10 * time.Second

// clientOptions configures paho for at-least-once delivery (at QoS 1 and
// 2): a persistent session (unless shared, see Options.ClientID), and acks
// sent only once a message's deadline is stored.
//
// Order matters (paho's default): the handler is called for one message at
// a time, in the order the broker sent them. The watermark depends on it —
// a probe's barrier must enter the pipeline after every signal received
// before the probe. The handler only parses and hands over, so it is cheap;
// it blocks only when MaxInFlight signals are in flight, which stops paho
// reading from the connection and lets the broker queue.
func (s *source) clientOptions() *mqtt.ClientOptions {
	o := mqtt.NewClientOptions()
	for _, b := range s.opts.Brokers {
		o.AddBroker(b)
	}
	o.SetClientID(s.opts.ClientID).
		SetCleanSession(s.opts.SharedGroup != ""). // see Options.ClientID
		SetAutoAckDisabled(true).
		SetOrderMatters(true).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(time.Second).
		SetMaxReconnectInterval(reconnectMax).
		SetWriteTimeout(5 * time.Second).
		SetKeepAlive(15 * time.Second).
		SetResumeSubs(false).
		SetDefaultPublishHandler(s.onMessage).
		SetOnConnectHandler(s.onConnect).
		SetConnectionLostHandler(s.onConnectionLost).
		SetConnectionNotificationHandler(s.onConnectionNotification)
	if s.opts.Username != "" {
		o.SetUsername(s.opts.Username)
		o.SetPassword(s.opts.Password)
	}
	if s.opts.TLS != nil {
		o.SetTLSConfig(s.opts.TLS)
	}
	return o
}

// onConnect (re)subscribes on every connection: the session normally keeps
// the subscriptions, but a broker that lost its state does not. Messages
// are routed by the default handler, so a message matching several filters
// is still handled once.
func (s *source) onConnect(c mqtt.Client) {
	filters := make(map[string]byte, len(s.opts.Topics)+1)
	for _, f := range s.opts.Topics {
		if s.opts.SharedGroup != "" {
			f = "$share/" + s.opts.SharedGroup + "/" + f
		}
		filters[f] = *s.opts.QoS
	}
	// The probe topic is never shared: a probe must come back to the
	// instance that sent it.
	filters[s.opts.ProbeTopic] = 1
	tok := c.SubscribeMultiple(filters, nil)
	if !tok.WaitTimeout(subscribeWait) {
		s.log.Error("subscribe timed out; watermark held until the next connection", "filters", keys(filters))
		return
	}
	if err := tok.Error(); err != nil {
		s.log.Error("subscribe failed; watermark held until the next connection", "filters", keys(filters), "err", err)
		return
	}
	for f, q := range tok.(*mqtt.SubscribeToken).Result() {
		if q == 0x80 {
			s.log.Error("broker refused subscription; watermark held until the next connection", "filter", f)
			return
		}
		if q < filters[f] {
			s.log.Warn("broker granted a lower QoS than asked for", "filter", f, "granted", q, "asked", filters[f])
		}
	}
	// Only probes sent from now on vouch for this connection.
	s.connectedAt.Store(s.opts.Now().UnixMilli())
	s.log.Info("connected to MQTT broker", "filters", keys(filters), "qos", *s.opts.QoS)
	// Mosquitto drops QoS 1 messages silently when a subscriber's queue is
	// full; it says so only in $SYS. Other brokers may refuse the filter,
	// which costs nothing.
	c.Subscribe(sysDropped, 0, s.onDropped)
}

// sysDropped is where Mosquitto publishes how many messages it dropped.
const sysDropped = "$SYS/broker/publish/messages/dropped"

func (s *source) onDropped(_ mqtt.Client, m mqtt.Message) {
	n, err := strconv.ParseInt(strings.TrimSpace(string(m.Payload())), 10, 64)
	if err != nil {
		return
	}
	if old := s.brokerDropped.Swap(n); old >= 0 && n > old {
		s.log.Warn("the MQTT broker dropped messages: raise max_queued_messages (see deploy/local/mosquitto.conf)",
			"dropped_total", n, "new", n-old)
	}
}

func keys(m map[string]byte) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// onConnectionNotification reports refused connection attempts (wrong
// credentials, TLS trouble, broker down), which paho otherwise retries in
// silence. The same reason is logged at most once a minute.
func (s *source) onConnectionNotification(_ mqtt.Client, n mqtt.ConnectionNotification) {
	f, ok := n.(mqtt.ConnectionNotificationFailed)
	if !ok || f.Reason == nil {
		return
	}
	if ok, _ := s.connLog.Allow(f.Reason.Error()); ok {
		s.log.Error("cannot connect to the MQTT broker; retrying (check mqtt.brokers, credentials and TLS)",
			"brokers", s.opts.Brokers, "err", f.Reason)
	}
}

func (s *source) onConnectionLost(_ mqtt.Client, err error) {
	s.log.Warn("lost MQTT connection; reconnecting", "err", err)
}

// onMessage handles one message from the broker. It is called by paho's
// router, one message at a time.
func (s *source) onMessage(_ mqtt.Client, m mqtt.Message) {
	if m.Retained() {
		// The broker replays retained messages on every subscription, and
		// ingest resubscribes on every connection: a replay is old news,
		// and counting it would keep a dead device alive.
		m.Ack()
		return
	}
	topic := m.Topic()
	if topic == sysDropped {
		s.onDropped(nil, m)
		return
	}
	if topic == s.opts.ProbeTopic {
		s.onProbe(m)
		return
	}
	now := s.opts.Now()
	id, typ, err := ParseTopic(topic, s.opts.IDLevel, s.opts.TypeLevel, s.opts.MaxIDLen)
	at := now
	if err == nil && s.opts.TimestampMode == TimestampPayload {
		var ts time.Time
		if ts, err = ParseTimestamp(m.Payload()); err == nil {
			at = clamp(ts, now, s.opts.MaxSkew)
		}
	}
	if err != nil {
		s.dead.refuse(err, topic, m, now)
		return
	}
	// An error means ingest is stopping: the message stays unacked and the
	// broker delivers it again to the next session.
	_ = s.pipe.enqueue(context.Background(), s.pipe.signal(id, typ, at, m, nil))
}

// onProbe passes a returned probe to the pipeline as a barrier. A probe
// counts only if it was sent on the current connection: one sent before a
// disconnection (and resent after it, or left over in the session) says
// nothing about the time in between.
func (s *source) onProbe(m mqtt.Message) {
	m.Ack()
	ms, err := strconv.ParseInt(string(m.Payload()), 10, 64)
	if err != nil || ms <= 0 || ms < s.connectedAt.Load() {
		return
	}
	s.pipe.enqueueBarrier(ms)
}
