package ingest

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// connOptions are what both connections share: the brokers, reconnection,
// timeouts, credentials and TLS.
func (s *source) connOptions(clientID string) *mqtt.ClientOptions {
	o := mqtt.NewClientOptions()
	for _, b := range s.opts.Brokers {
		o.AddBroker(b)
	}
	o.SetClientID(clientID).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(time.Second).
		SetMaxReconnectInterval(reconnectMax).
		SetWriteTimeout(5 * time.Second).
		SetKeepAlive(15 * time.Second).
		SetStore(newCopyStore())
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
	return s.withState(s.connOptions(s.opts.ClientID)).
		SetCleanSession(cleanSession(s.opts)). // see Options.ClientID
		SetAutoAckDisabled(true).
		SetOrderMatters(true).
		SetResumeSubs(false).
		SetDefaultPublishHandler(s.onMessage).
		SetOnConnectHandler(s.onConnect).
		SetConnectionLostHandler(s.onConnectionLost).
		SetReconnectingHandler(s.onReconnecting).
		SetConnectionNotificationHandler(s.onConnectionNotification)
}

// onConnect (re)subscribes on every connection: the session normally keeps
// the subscriptions, but a broker that lost its state does not. Messages
// are routed by the default handler, so a message matching several filters
// is still handled once.
//
// A member of a shared group joins the group's watermark before it
// subscribes, at a time no later than anything the broker can route to it,
// so that the group's watermark waits for it from its first signal on.
// Once the member is leaving (handOver), it subscribes only its probes.
//
// Unless there is one filter, with the probe riding its subscription, the
// watermark is sound only on a broker that keeps one order across a
// session's subscriptions; unless the operator vouches for the broker
// (OrderedBroker), it must show it is Mosquitto first, on every connection
// (the brokers listed may differ).
func (s *source) onConnect(c mqtt.Client) {
	if s.opts.ordered != "" && !s.opts.OrderedBroker {
		ok, err := s.identify(c)
		if err != nil {
			s.log.Error("refusing the MQTT broker", "err", err)
			select {
			case s.refused <- err:
			default:
			}
		}
		if !ok {
			return
		}
	}
	// The broker's uptime says whether it restarted while the connection
	// was down (see breaks). Subscribed before the signals, its retained
	// value arrives before any probe that vouches for this connection.
	c.Subscribe(sysUptime, 0, s.onUptime)
	filters := make(map[string]byte, len(s.opts.Topics)+1)
	if !s.leaving.Load() {
		if s.join != nil && !s.joinGroup(c) {
			return
		}
		for _, f := range s.deviceFilters() {
			filters[f] = *s.opts.QoS
		}
	}
	// The probe topic is never shared: a probe must come back to the
	// instance that sent it. A probe under a signal filter rides that
	// subscription, in order with its signals.
	if !s.opts.inband {
		filters[s.opts.ProbeTopic] = 1
	}
	tok := c.SubscribeMultiple(filters, nil)
	if !tok.WaitTimeout(subscribeWait) {
		s.log.Error("subscribe timed out; watermark held until the next connection", "filters", keys(filters))
		return
	}
	if err := tok.Error(); err != nil {
		s.log.Error("subscribe failed; watermark held until the next connection", "filters", keys(filters), "err", err)
		return
	}
	for f, q := range granted(tok) {
		if q == 0x80 {
			s.log.Error("broker refused subscription; watermark held until the next connection", "filter", f)
			return
		}
		if q < filters[f] {
			s.log.Warn("broker granted a lower QoS than asked for", "filter", f, "granted", q, "asked", filters[f])
		}
	}
	// Only probes sent from now on vouch for this connection.
	now := s.opts.Now().UnixMilli()
	s.connectedAt.Store(now)
	s.breaks.connected(now)
	s.log.Info("connected to MQTT broker", "filters", keys(filters), "qos", *s.opts.QoS)
	if s.opts.Sparkplug.Enabled {
		s.publishState()
	}
	// Mosquitto drops QoS 1 messages silently when a subscriber's queue is
	// full; it says so only in $SYS. Other brokers may refuse the filter,
	// which costs nothing.
	c.Subscribe(sysDropped, 0, s.onDropped)
}

// joinGroup records this member in its group's watermark, retrying while
// the connection is up. It reports false if the connection went down
// first: the next connection tries again.
func (s *source) joinGroup(c mqtt.Client) bool {
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		err := s.join(ctx, s.opts.Now().UnixMilli())
		cancel()
		if err == nil {
			return true
		}
		s.log.Warn("joining the group's watermark failed; not subscribing until it succeeds", "err", err, "attempt", attempt+1)
		if !c.IsConnectionOpen() || s.leaving.Load() {
			return false
		}
		time.Sleep(storeBackoff.Delay(attempt))
	}
}

// granted returns what a subscription's token says of each filter: the
// QoS granted, or 0x80 if refused.
func granted(tok mqtt.Token) map[string]byte {
	if r, ok := tok.(interface{ Result() map[string]byte }); ok {
		return r.Result()
	}
	return nil
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
	if b, ok := n.(mqtt.ConnectionNotificationBroker); ok {
		s.breaks.attempt(b.Broker.String())
		return
	}
	f, ok := n.(mqtt.ConnectionNotificationFailed)
	if !ok || f.Reason == nil {
		return
	}
	if ok, _ := s.connLog.Allow(f.Reason.Error()); ok {
		s.log.Error("cannot connect to the MQTT broker; retrying (check mqtt.brokers, credentials and TLS)",
			"brokers", s.opts.Brokers, "err", f.Reason)
	}
}

// onReconnecting runs before each reconnection attempt, before anything of
// the new connection arrives: the connection is down, which is an outage
// (see breaks), and the broker's first report on the new one is a new
// baseline (it may be another broker, or the same one restarted). Not
// onConnect: a persistent session's messages can arrive before it runs.
func (s *source) onReconnecting(mqtt.Client, *mqtt.ClientOptions) {
	s.breaks.lose(s.opts.Now().UnixMilli())
	s.dropBase.Store(-1)
}

func (s *source) onConnectionLost(_ mqtt.Client, err error) {
	now := s.opts.Now().UnixMilli()
	s.breaks.noticed(now)
	s.log.Warn("lost MQTT connection; reconnecting (an ingest outage until it is back)", "err", err)
	s.noteTakenOver(err, now)
}

// takenOverAfter is how many connections in a row the broker closes soon
// after they opened before it is said that another client may use this
// client id; shortLived is how soon.
const (
	takenOverAfter = 3
	shortLived     = 10 * time.Second
)

// noteTakenOver says once when the broker keeps closing fresh connections
// (EOF, or an MQTT 5 "session taken over"): the usual cause is another
// client connecting with the same client id, which the claim in Redis
// catches only among sigwatch processes of one installation.
func (s *source) noteTakenOver(err error, now int64) {
	at := s.connectedAt.Load()
	taken := errors.Is(err, io.EOF) || err != nil && strings.Contains(strings.ToLower(err.Error()), "taken over")
	if !taken || at == 0 || now-at > shortLived.Milliseconds() {
		s.shortLived.Store(0)
		return
	}
	if s.shortLived.Add(1) >= takenOverAfter && s.takenOverSaid.CompareAndSwap(false, true) {
		s.log.Error("the broker keeps closing the connection soon after it opens: another client with the same mqtt.client_id may be connected; give each its own (SIGWATCH_MQTT_CLIENT_ID)",
			"client_id", s.opts.ClientID, "closed", takenOverAfter)
	}
}
