package ingest

import (
	"context"
	"strconv"
	"strings"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// subscribeWait bounds how long a (re)subscription may take.
const subscribeWait = 10 * time.Second

// clientOptions configures paho for at-least-once delivery: a persistent
// session (unless shared, see Options.ClientID), and acks sent only once a
// message's deadline is stored.
//
// Order matters (paho's default): the handler is called for one message at
// a time, in the order the broker sent them. The watermark depends on it —
// a probe's barrier must enter the pipeline after every signal received
// before the probe. The handler only parses and hands over, so it is cheap;
// it blocks only when MaxInFlight signals are in flight, which stops paho
// reading from the connection and lets the broker queue.
func (in *Ingest) clientOptions() *mqtt.ClientOptions {
	o := mqtt.NewClientOptions()
	for _, b := range in.opts.Brokers {
		o.AddBroker(b)
	}
	o.SetClientID(in.opts.ClientID).
		SetCleanSession(in.opts.SharedGroup != ""). // see Options.ClientID
		SetAutoAckDisabled(true).
		SetOrderMatters(true).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(time.Second).
		SetMaxReconnectInterval(reconnectMax).
		SetWriteTimeout(5 * time.Second).
		SetKeepAlive(15 * time.Second).
		SetResumeSubs(false).
		SetDefaultPublishHandler(in.onMessage).
		SetOnConnectHandler(in.onConnect).
		SetConnectionLostHandler(in.onConnectionLost).
		SetConnectionNotificationHandler(in.onConnectionNotification)
	if in.opts.Username != "" {
		o.SetUsername(in.opts.Username)
		o.SetPassword(in.opts.Password)
	}
	if in.opts.TLS != nil {
		o.SetTLSConfig(in.opts.TLS)
	}
	return o
}

// onConnect (re)subscribes on every connection: the session normally keeps
// the subscriptions, but a broker that lost its state does not. Messages
// are routed by the default handler, so a message matching several filters
// is still handled once.
func (in *Ingest) onConnect(c mqtt.Client) {
	filters := make(map[string]byte, len(in.opts.Topics)+1)
	for _, f := range in.opts.Topics {
		if in.opts.SharedGroup != "" {
			f = "$share/" + in.opts.SharedGroup + "/" + f
		}
		filters[f] = in.opts.QoS
	}
	// The probe topic is never shared: a probe must come back to the
	// instance that sent it.
	filters[in.opts.ProbeTopic] = 1
	tok := c.SubscribeMultiple(filters, nil)
	if !tok.WaitTimeout(subscribeWait) {
		in.log.Error("subscribe timed out; watermark held until the next connection", "filters", keys(filters))
		return
	}
	if err := tok.Error(); err != nil {
		in.log.Error("subscribe failed; watermark held until the next connection", "filters", keys(filters), "err", err)
		return
	}
	for f, q := range tok.(*mqtt.SubscribeToken).Result() {
		if q == 0x80 {
			in.log.Error("broker refused subscription; watermark held until the next connection", "filter", f)
			return
		}
		if q < filters[f] {
			in.log.Warn("broker granted a lower QoS than asked for", "filter", f, "granted", q, "asked", filters[f])
		}
	}
	// Only probes sent from now on vouch for this connection.
	in.connectedAt.Store(in.now().UnixMilli())
	in.log.Info("connected to MQTT broker", "filters", keys(filters))
	// Mosquitto drops QoS 1 messages silently when a subscriber's queue is
	// full; it says so only in $SYS. Other brokers may refuse the filter,
	// which costs nothing.
	c.Subscribe(sysDropped, 0, in.onDropped)
}

// sysDropped is where Mosquitto publishes how many messages it dropped.
const sysDropped = "$SYS/broker/publish/messages/dropped"

func (in *Ingest) onDropped(_ mqtt.Client, m mqtt.Message) {
	n, err := strconv.ParseInt(strings.TrimSpace(string(m.Payload())), 10, 64)
	if err != nil {
		return
	}
	if old := in.brokerDropped.Swap(n); old >= 0 && n > old {
		in.log.Warn("the MQTT broker dropped messages: raise max_queued_messages (see deploy/local/mosquitto.conf)",
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

// Connected reports whether ingest is connected to the broker and has
// subscribed at least once (for readiness). Without Brokers there is
// nothing to connect to, and it reports true.
func (in *Ingest) Connected() bool {
	if len(in.opts.Brokers) == 0 {
		return true
	}
	c := in.client.Load()
	return c != nil && (*c).IsConnectionOpen() && in.connectedAt.Load() != 0
}

// onConnectionNotification reports refused connection attempts (wrong
// credentials, TLS trouble, broker down), which paho otherwise retries in
// silence. The same reason is logged at most once a minute.
func (in *Ingest) onConnectionNotification(_ mqtt.Client, n mqtt.ConnectionNotification) {
	f, ok := n.(mqtt.ConnectionNotificationFailed)
	if !ok || f.Reason == nil {
		return
	}
	in.connFailMu.Lock()
	reason := f.Reason.Error()
	now := time.Now()
	quiet := reason == in.connFailLast && now.Sub(in.connFailAt) < time.Minute
	if !quiet {
		in.connFailLast, in.connFailAt = reason, now
	}
	in.connFailMu.Unlock()
	if !quiet {
		in.log.Error("cannot connect to the MQTT broker; retrying (check mqtt.brokers, credentials and TLS)",
			"brokers", in.opts.Brokers, "err", f.Reason)
	}
}

func (in *Ingest) onConnectionLost(_ mqtt.Client, err error) {
	in.log.Warn("lost MQTT connection; reconnecting", "err", err)
}

// onMessage handles one message from the broker. It is called by paho's
// router, one message at a time.
func (in *Ingest) onMessage(_ mqtt.Client, m mqtt.Message) {
	if m.Retained() {
		// The broker replays retained messages on every subscription, and
		// ingest resubscribes on every connection: a replay is old news,
		// and counting it would keep a dead device alive.
		m.Ack()
		return
	}
	topic := m.Topic()
	if topic == sysDropped {
		in.onDropped(nil, m)
		return
	}
	if topic == in.opts.ProbeTopic {
		in.onProbe(m)
		return
	}
	now := in.now()
	id, typ, err := ParseTopic(topic, in.opts.IDLevel, in.opts.TypeLevel, in.opts.MaxIDLen)
	at := now
	if err == nil && in.payloadTS {
		var ts time.Time
		if ts, err = ParseTimestamp(m.Payload()); err == nil {
			at = clamp(ts, now, in.opts.MaxSkew)
		}
	}
	if err != nil {
		in.refuse(err, topic, m, now)
		return
	}
	// An error means ingest is stopping: the message stays unacked and the
	// broker delivers it again to the next session.
	_ = in.enqueue(context.Background(), in.newSignal(id, typ, at, m, nil))
}

// onProbe passes a returned probe to the pipeline as a barrier. A probe
// counts only if it was sent on the current connection: one sent before a
// disconnection (and resent after it, or left over in the session) says
// nothing about the time in between.
func (in *Ingest) onProbe(m mqtt.Message) {
	m.Ack()
	ms, err := strconv.ParseInt(string(m.Payload()), 10, 64)
	if err != nil || ms <= 0 || ms < in.connectedAt.Load() {
		return
	}
	in.enqueueBarrier(ms)
}

// probe publishes a probe carrying its send time every ProbeInterval while
// the connection is up, until stop is closed.
func (in *Ingest) probe(c mqtt.Client, stop <-chan struct{}) {
	tick := time.NewTicker(in.opts.ProbeInterval)
	defer tick.Stop()
	var buf []byte
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if !c.IsConnectionOpen() || in.connectedAt.Load() == 0 {
			continue
		}
		buf = strconv.AppendInt(buf[:0], in.now().UnixMilli(), 10)
		// The token is not awaited: a probe that never comes back simply
		// does not advance the watermark. paho keeps the payload slice, so
		// each probe gets its own.
		c.Publish(in.opts.ProbeTopic, 1, false, append([]byte(nil), buf...))
	}
}
