package ingest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
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

// TestStoppingMemberHandsOver stops one of two members of a shared group
// while signals stream in: every signal the broker accepted is stored (the
// stopping member stores what was routed to it before it leaves, and the
// broker routes the rest to the other), and the member leaves the group's
// watermark only then (invariant 6).
func TestStoppingMemberHandsOver(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	// The backlog routed to a is stored within the production drain, not
	// necessarily within the shortened one on a loaded machine.
	r.drain = drainTimeout
	a := r.start(t, Options{ClientID: "member-a", SharedGroup: "g"})
	r.start(t, Options{ClientID: "member-b", SharedGroup: "g"})
	dev := device(t, r.env.Mosquitto.URL)

	const n = 3000
	toks := make([]mqtt.Token, 0, n)
	for j := range n {
		toks = append(toks, dev.Publish(fmt.Sprintf("devices/h%d/signal", j), 1, false, []byte{}))
		if j == n/3 {
			go a.cancel()
		}
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	a.stop(t)
	if got := testutil.ToFloat64(a.m.signals); got == 0 {
		t.Fatalf("the stopping member stored no signal; the test proves nothing")
	}
	missing := func() []string {
		var out []string
		for j := range n {
			if _, ok := r.deadline(t, fmt.Sprintf("h%d", j)); !ok {
				out = append(out, fmt.Sprintf("h%d", j))
			}
		}
		return out
	}
	m := missing()
	for end := time.Now().Add(5 * time.Second); len(m) > 0 && time.Now().Before(end); m = missing() {
		time.Sleep(100 * time.Millisecond)
	}
	if len(m) > 0 {
		t.Errorf("%d of %d signals never stored, e.g. %v", len(m), n, m[:min(5, len(m))])
	}
	ms, err := r.store.Watermarks().Members(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ms["g|member-a"]; ok {
		t.Errorf("members after a handed over = %v, want a gone", ms)
	}
}

// TestMemberJoinsBeforeConsuming proves that a shared-group member is part
// of its group's watermark from before its subscription, not from its
// first probe on: the group's watermark never vouches for signals routed
// to it and not yet stored. A member already recorded (its last run
// crashed) keeps its older watermark, so the gap is recorded as an outage.
func TestMemberJoinsBeforeConsuming(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	ctx := context.Background()
	// Probes far apart: no barrier passes during the test.
	slow := Options{SharedGroup: "g", Config: Config{ProbeInterval: time.Hour}}

	before := time.Now().UnixMilli()
	o := slow
	o.ClientID = "fresh"
	a := r.start(t, o)
	ms, err := r.store.Watermarks().Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := ms["g|fresh"]; !ok || got < before || got > a.src.connectedAt.Load() {
		t.Errorf("member watermark when subscribed = %d (present %v), want in [%d, %d]", got, ok, before, a.src.connectedAt.Load())
	}

	const old = 1_000
	if err := r.store.Watermarks().Join(ctx, shard.Member{Group: "g", ID: "crashed"}, old); err != nil {
		t.Fatal(err)
	}
	o.ClientID = "crashed"
	r.start(t, o)
	if ms, err = r.store.Watermarks().Members(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ms["g|crashed"]; got != old {
		t.Errorf("watermark of a member restarting after a crash = %d, want its old %d", got, old)
	}
}
