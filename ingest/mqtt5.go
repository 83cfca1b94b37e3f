package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// The MQTT protocol versions ingest speaks (mqtt.protocol).
const (
	Protocol311 = "3.1.1"
	Protocol5   = "5"
)

// newClient makes the subscriber's client for the protocol: paho's MQTT
// 3.1.1 client, or client5, which speaks MQTT 5 behind the same interface,
// so that the source, its probes, breaks and evidence work on either.
func newClient(o *mqtt.ClientOptions, protocol string) mqtt.Client {
	if protocol == Protocol5 {
		return newClient5(o)
	}
	return mqtt.NewClient(o)
}

// ackInterval is how often client5 sends the acks released so far (in the
// order the messages came, as MQTT requires).
const ackInterval = 5 * time.Millisecond

// receiveMaximum bounds the messages the broker sends unacked: enough to
// cover a flush and the ack interval at full rate, and few enough that
// paho's ordered ack list stays short.
const receiveMaximum = 2048

// sessionExpiry keeps an MQTT 5 session as long as the broker allows, as
// an MQTT 3.1.1 persistent session is kept: the broker holds the signals
// while sigwatch restarts.
const sessionExpiry = 0xFFFFFFFF

// client5 is an MQTT 5 client (eclipse/paho.golang's autopaho) behind
// paho.mqtt.golang's Client interface and options, as the source uses
// them: one message handed to the handlers at a time, in order; acks only
// when the message's Ack is called, sent in order; the connect,
// connection-lost, reconnecting and notification handlers called as paho's
// are. Messages carry their MQTT 5 user properties (see userProperties).
type client5 struct {
	o *mqtt.ClientOptions

	cm     atomic.Pointer[autopaho.ConnectionManager]
	cancel context.CancelFunc
	up     atomic.Bool
	// gen counts connection attempts: a message is acked only on the
	// connection it came on, never by its packet id on a later one.
	gen    atomic.Uint64
	everUp atomic.Bool
	// lostSaid: the current connection's loss was reported.
	lostSaid atomic.Bool

	mu     sync.Mutex
	routes map[string]mqtt.MessageHandler // subscribed filter -> handler
}

func newClient5(o *mqtt.ClientOptions) *client5 {
	return &client5{o: o, routes: make(map[string]mqtt.MessageHandler)}
}

func (c *client5) IsConnected() bool      { return c.up.Load() }
func (c *client5) IsConnectionOpen() bool { return c.up.Load() }

func (c *client5) OptionsReader() mqtt.ClientOptionsReader { return mqtt.NewOptionsReader(c.o) }

// Connect starts connecting, and reconnecting whenever the connection is
// lost, until Disconnect. Its token completes with the first connection.
func (c *client5) Connect() mqtt.Token {
	t := newToken5()
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	first := sync.OnceFunc(func() { t.finish(nil) })
	cfg := c.config(first)
	cm, err := autopaho.NewConnection(ctx, cfg)
	if err != nil {
		cancel()
		t.finish(fmt.Errorf("mqtt 5: %w", err))
		return t
	}
	c.cm.Store(cm)
	return t
}

// config maps paho's options onto autopaho's.
func (c *client5) config(first func()) autopaho.ClientConfig {
	o := c.o
	minDelay := max(o.ConnectRetryInterval, 100*time.Millisecond)
	maxDelay := max(o.MaxReconnectInterval, 2*minDelay)
	cfg := autopaho.ClientConfig{
		ServerUrls:                    o.Servers,
		TlsCfg:                        o.TLSConfig,
		KeepAlive:                     uint16(o.KeepAlive),
		CleanStartOnInitialConnection: o.CleanSession,
		ReconnectBackoff:              autopaho.NewExponentialBackoff(minDelay, maxDelay, minDelay, 2),
		ConnectTimeout:                max(o.ConnectTimeout, 5*time.Second),
		ConnectUsername:               o.Username,
		ConnectPassword:               []byte(o.Password),
		ConnectPacketBuilder:          c.attempt,
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			// The first connection can come up before NewConnection
			// returns its manager to Connect.
			c.cm.Store(cm)
			c.lostSaid.Store(false)
			c.up.Store(true)
			c.everUp.Store(true)
			first()
			if c.o.OnConnect != nil {
				go c.o.OnConnect(c)
			}
		},
		// autopaho reports a connection down only once its handlers
		// returned; the first error reports the loss when it happens.
		OnConnectionDown: func() bool {
			c.lost(errors.New("connection lost"))
			return true
		},
		OnConnectError: func(err error) {
			c.notify(mqtt.ConnectionNotificationFailed{Reason: err})
		},
		ClientConfig: paho.ClientConfig{
			ClientID:                   o.ClientID,
			EnableManualAcknowledgment: true,
			SendAcksInterval:           ackInterval,
			OnPublishReceived:          []func(paho.PublishReceived) (bool, error){c.received},
			OnClientError:              c.lost,
			OnServerDisconnect: func(d *paho.Disconnect) {
				err := fmt.Errorf("the broker disconnected: reason code %#x", d.ReasonCode)
				if d.ReasonCode == 0x8E {
					err = errors.New("session taken over")
				}
				c.lost(err)
			},
		},
	}
	if !o.CleanSession {
		cfg.SessionExpiryInterval = sessionExpiry
	}
	if o.WillEnabled {
		cfg.WillMessage = &paho.WillMessage{Topic: o.WillTopic, Payload: o.WillPayload, QoS: o.WillQos, Retain: o.WillRetained}
	}
	return cfg
}

// attempt runs before each connection attempt: a new connection's
// messages are acked on it only, and a reconnection is reported as paho's
// reconnecting handler does, before anything of the new connection comes.
func (c *client5) attempt(cp *paho.Connect, u *url.URL) (*paho.Connect, error) {
	c.gen.Add(1)
	if cp.Properties == nil {
		cp.Properties = &paho.ConnectProperties{}
	}
	rm := uint16(receiveMaximum)
	cp.Properties.ReceiveMaximum = &rm
	if c.everUp.Load() && c.o.OnReconnecting != nil {
		c.o.OnReconnecting(c, c.o)
	}
	c.notify(mqtt.ConnectionNotificationBroker{Broker: u})
	return cp, nil
}

// lost reports the current connection lost, once, as paho's
// connection-lost handler does.
func (c *client5) lost(err error) {
	if !c.lostSaid.CompareAndSwap(false, true) {
		return
	}
	c.up.Store(false)
	if c.o.OnConnectionLost != nil {
		go c.o.OnConnectionLost(c, err)
	}
}

func (c *client5) notify(n mqtt.ConnectionNotification) {
	if c.o.OnConnectionNotification != nil {
		c.o.OnConnectionNotification(c, n)
	}
}

// received hands one message to the handlers of the filters it matches,
// or to the default handler; autopaho calls it for one message at a time,
// in the order they came.
func (c *client5) received(pr paho.PublishReceived) (bool, error) {
	m := &message5{p: pr.Packet, client: pr.Client, gen: c.gen.Load(), c: c}
	var hs []mqtt.MessageHandler
	c.mu.Lock()
	for f, h := range c.routes {
		if matches(f, m.p.Topic) {
			hs = append(hs, h)
		}
	}
	c.mu.Unlock()
	if len(hs) == 0 && c.o.DefaultPublishHandler != nil {
		hs = append(hs, c.o.DefaultPublishHandler)
	}
	for _, h := range hs {
		h(c, m)
	}
	return true, nil
}

// Disconnect lets the acks already released go out, then ends the
// connection for good.
func (c *client5) Disconnect(quiesce uint) {
	if c.cancel == nil {
		return
	}
	defer c.cancel()
	c.lostSaid.Store(true) // an end asked for is no loss
	time.Sleep(2 * ackInterval)
	cm := c.cm.Load()
	if cm == nil {
		c.cancel()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(time.Duration(quiesce)*time.Millisecond, time.Second))
	defer cancel()
	_ = cm.Disconnect(ctx)
	c.up.Store(false)
}

func (c *client5) Publish(topic string, qos byte, retained bool, payload any) mqtt.Token {
	t := newToken5()
	var b []byte
	switch p := payload.(type) {
	case []byte:
		b = p
	case string:
		b = []byte(p)
	default:
		t.finish(fmt.Errorf("mqtt 5: unknown payload type %T", payload))
		return t
	}
	cm := c.cm.Load()
	if cm == nil || !c.up.Load() {
		t.finish(errors.New("mqtt 5: not connected"))
		return t
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), max(c.o.WriteTimeout, 5*time.Second))
		defer cancel()
		_, err := cm.Publish(ctx, &paho.Publish{Topic: topic, QoS: qos, Retain: retained, Payload: b})
		t.finish(err)
	}()
	return t
}

func (c *client5) Subscribe(topic string, qos byte, callback mqtt.MessageHandler) mqtt.Token {
	return c.SubscribeMultiple(map[string]byte{topic: qos}, callback)
}

// SubscribeMultiple subscribes filters; its token's Result gives each
// filter's granted QoS, or 0x80 where the broker refused it.
func (c *client5) SubscribeMultiple(filters map[string]byte, callback mqtt.MessageHandler) mqtt.Token {
	t := newToken5()
	if callback != nil {
		c.mu.Lock()
		for f := range filters {
			c.routes[f] = callback
		}
		c.mu.Unlock()
	}
	cm := c.cm.Load()
	if cm == nil {
		t.finish(errors.New("mqtt 5: not connected"))
		return t
	}
	sub := &paho.Subscribe{}
	for f, q := range filters {
		sub.Subscriptions = append(sub.Subscriptions, paho.SubscribeOptions{Topic: f, QoS: q})
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), subscribeWait)
		defer cancel()
		sa, err := cm.Subscribe(ctx, sub)
		if sa != nil && len(sa.Reasons) == len(sub.Subscriptions) {
			res := make(map[string]byte, len(sub.Subscriptions))
			for i, s := range sub.Subscriptions {
				r := sa.Reasons[i]
				if r >= 0x80 {
					r = 0x80
				}
				res[s.Topic] = r
			}
			t.result = res
			err = nil // a refused filter is in the result, as with paho
		}
		t.finish(err)
	}()
	return t
}

func (c *client5) Unsubscribe(topics ...string) mqtt.Token {
	t := newToken5()
	c.mu.Lock()
	for _, f := range topics {
		delete(c.routes, f)
	}
	c.mu.Unlock()
	cm := c.cm.Load()
	if cm == nil {
		t.finish(errors.New("mqtt 5: not connected"))
		return t
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), subscribeWait)
		defer cancel()
		_, err := cm.Unsubscribe(ctx, &paho.Unsubscribe{Topics: topics})
		t.finish(err)
	}()
	return t
}

func (c *client5) AddRoute(topic string, callback mqtt.MessageHandler) {
	c.mu.Lock()
	c.routes[topic] = callback
	c.mu.Unlock()
}

// matches reports whether topic matches the MQTT filter f (a shared
// subscription's "$share/<group>/" prefix aside).
func matches(f, topic string) bool {
	if strings.HasPrefix(f, "$share/") {
		if _, rest, ok := strings.Cut(f[len("$share/"):], "/"); ok {
			f = rest
		}
	}
	if strings.HasPrefix(topic, "$") != strings.HasPrefix(f, "$") {
		return false
	}
	fl, tl := strings.Split(f, "/"), strings.Split(topic, "/")
	for i, l := range fl {
		if l == "#" {
			return true
		}
		if i >= len(tl) || l != "+" && l != tl[i] {
			return false
		}
	}
	return len(fl) == len(tl)
}
