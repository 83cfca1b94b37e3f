package ingest

import (
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// message5 is an MQTT 5 message behind paho.mqtt.golang's Message
// interface, with its user properties.
type message5 struct {
	p      *paho.Publish
	client *paho.Client
	gen    uint64
	c      *client5
	once   sync.Once
}

func (m *message5) Duplicate() bool   { return m.p.Duplicate() }
func (m *message5) Qos() byte         { return m.p.QoS }
func (m *message5) Retained() bool    { return m.p.Retain }
func (m *message5) Topic() string     { return m.p.Topic }
func (m *message5) MessageID() uint16 { return m.p.PacketID }
func (m *message5) Payload() []byte   { return m.p.Payload }

// Ack releases the message's ack, once, on the connection it came on: on a
// later connection its packet id may name another message. The broker
// then delivers it again (a persistent session) or has dropped it (a
// clean one), as with paho.
func (m *message5) Ack() {
	m.once.Do(func() {
		if m.p.QoS == 0 || m.client == nil || m.gen != m.c.gen.Load() {
			return
		}
		_ = m.client.Ack(m.p)
	})
}

// userProperty returns the value of the MQTT 5 user property key, and
// whether the message has it.
func (m *message5) userProperty(key string) (string, bool) {
	if m.p.Properties == nil {
		return "", false
	}
	for _, u := range m.p.Properties.User {
		if u.Key == key {
			return u.Value, true
		}
	}
	return "", false
}

// token5 is a paho.mqtt.golang Token completed by client5.
type token5 struct {
	done   chan struct{}
	err    error
	result map[string]byte
}

func newToken5() *token5 { return &token5{done: make(chan struct{})} }

func (t *token5) finish(err error) {
	t.err = err
	close(t.done)
}

func (t *token5) Wait() bool { <-t.done; return true }

func (t *token5) WaitTimeout(d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-t.done:
		return true
	case <-tm.C:
		return false
	}
}

func (t *token5) Done() <-chan struct{} { return t.done }

// Error is nil until the token is done.
func (t *token5) Error() error {
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

// Result gives each filter's granted QoS (0x80: refused), as paho's
// SubscribeToken does.
func (t *token5) Result() map[string]byte {
	<-t.done
	return t.result
}
