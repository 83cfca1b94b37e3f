package ingest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// sharedMember is one clean-session member of a shared subscription group,
// as ingest runs it, that records what it receives and acks only when told.
type sharedMember struct {
	c     mqtt.Client
	probe string

	mu      sync.Mutex
	got     map[string]bool // shared topics received
	pending []mqtt.Message  // received, not acked
	probed  bool            // the probe came back
	after   int             // shared messages received after the probe
	hold    bool            // leave messages unacked
	slow    time.Duration   // time taken by each shared message
}

func joinShared(t *testing.T, url, id string, hold bool) *sharedMember {
	t.Helper()
	m := &sharedMember{probe: "roll/probe/" + id, got: map[string]bool{}, hold: hold}
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID(id).SetCleanSession(true).
		SetAutoAckDisabled(true).SetOrderMatters(true).SetDefaultPublishHandler(m.onMessage)
	m.c = testenv.MQTT(t, o)
	tok := m.c.SubscribeMultiple(map[string]byte{"$share/g/roll/+/signal": 1, m.probe: 1}, nil)
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", id, tok.Error())
	}
	return m
}

func (m *sharedMember) onMessage(_ mqtt.Client, msg mqtt.Message) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if msg.Topic() == m.probe {
		m.probed = true
		msg.Ack()
		return
	}
	if m.probed {
		m.after++
	}
	time.Sleep(m.slow)
	m.got[msg.Topic()] = true
	if m.hold {
		m.pending = append(m.pending, msg)
		return
	}
	msg.Ack()
}

func (m *sharedMember) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.got)
}

// TestSharedMemberLeaving measures what Mosquitto does with the messages of
// a shared subscription it routed to a clean-session member that then
// leaves, which decides how an ingest member may stop without losing
// signals (invariant 6):
//
//   - A member that disconnects with messages unacked loses them: the
//     broker neither redelivers them nor hands them to another member.
//   - A member that unsubscribes first still receives every message routed
//     to it before the unsubscribe, before a probe it publishes to itself
//     afterwards; later messages go to the others. Once the probe is back
//     and what came before it is acked, leaving loses nothing.
func TestSharedMemberLeaving(t *testing.T) {
	publishAll := func(t *testing.T, c mqtt.Client, from, n int) {
		t.Helper()
		toks := make([]mqtt.Token, 0, n)
		for i := from; i < from+n; i++ {
			toks = append(toks, c.Publish(fmt.Sprintf("roll/d%04d/signal", i), 1, false, []byte{}))
		}
		for _, tok := range toks {
			if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
				t.Errorf("publish: %v", tok.Error())
				return
			}
		}
	}

	t.Run("disconnect", func(t *testing.T) {
		// Fewer than the broker's in-flight window, so that all are sent.
		const n = 200
		env := testenv.New(t, testenv.Options{Mosquitto: true})
		a := joinShared(t, env.Mosquitto.URL, "member-a", true)
		b := joinShared(t, env.Mosquitto.URL, "member-b", false)
		pub := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID("roll-pub"))
		publishAll(t, pub, 0, n)
		testenv.WaitFor(t, 5*time.Second, "every message routed", func() bool { return a.count()+b.count() == n })
		routedToA, toB := a.count(), b.count()
		a.c.Disconnect(100)
		// Anything the broker still had for a would reach b within this.
		time.Sleep(time.Second)
		t.Logf("disconnect: %d of %d messages routed to the leaving member, unacked; the other member received %d of them afterwards",
			routedToA, n, b.count()-toB)
		if routedToA == 0 {
			t.Fatalf("no message was routed to the leaving member; the test proves nothing")
		}
		if got := b.count(); got != n-routedToA {
			t.Errorf("the other member received %d messages, want %d: the broker handed over a leaving member's unacked messages", got, n-routedToA)
		}
	})

	t.Run("unsubscribe then probe", func(t *testing.T) {
		// More than the broker's in-flight window (1,000) reach the slow
		// member, so some wait in its queue in the broker.
		const n = 2500
		env := testenv.New(t, testenv.Options{Mosquitto: true})
		a := joinShared(t, env.Mosquitto.URL, "member-a", false)
		// a falls behind, so the broker holds a backlog for it when it
		// unsubscribes.
		a.slow = 2 * time.Millisecond
		b := joinShared(t, env.Mosquitto.URL, "member-b", false)
		pub := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID("roll-pub"))

		// a has a backlog when it leaves, and messages keep coming.
		publishAll(t, pub, 0, n)
		var wg sync.WaitGroup
		wg.Go(func() { publishAll(t, pub, n, n) })
		backlog := a.count()
		if tok := a.c.Unsubscribe("$share/g/roll/+/signal"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("unsubscribe: %v", tok.Error())
		}
		if tok := a.c.Publish(a.probe, 1, false, []byte{}); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("probe: %v", tok.Error())
		}
		testenv.WaitFor(t, 10*time.Second, "the probe back", func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.probed })
		routedToA := a.count()
		backlog = routedToA - backlog
		a.c.Disconnect(100)
		wg.Wait()
		publishAll(t, pub, 2*n, n)
		testenv.WaitFor(t, 5*time.Second, "every message received", func() bool { return a.count()+b.count() >= 3*n })
		time.Sleep(200 * time.Millisecond)
		a.mu.Lock()
		after := a.after
		a.mu.Unlock()
		t.Logf("unsubscribe: %d of %d messages routed to the leaving member (%d of them not yet handled when it unsubscribed), all before its probe (%d after); the other member received %d; total %d of %d",
			routedToA, 3*n, backlog, after, b.count(), a.count()+b.count(), 3*n)
		if after != 0 {
			t.Errorf("%d messages reached the leaving member after its probe, want 0", after)
		}
		if backlog == 0 {
			t.Errorf("the leaving member had no backlog; the test proves nothing")
		}
		if got := a.count() + b.count(); got != 3*n {
			t.Errorf("the members received %d distinct messages, want %d", got, 3*n)
		}
	})
}
