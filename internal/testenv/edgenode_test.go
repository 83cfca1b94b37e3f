package testenv_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/internal/sparkplug"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// spbMsg is one Sparkplug message a watcher saw.
type spbMsg struct {
	topic sparkplug.Topic
	info  sparkplug.Info
	at    time.Time
}

func (m spbMsg) String() string {
	return fmt.Sprintf("%s/%s bdSeq=%d(%v) seq=%d", m.topic.Kind, m.topic.Device, m.info.BdSeq, m.info.HasBdSeq, m.info.Seq)
}

// spbWatcher records what a subscriber on spBv1.0/# receives.
type spbWatcher struct {
	mu   sync.Mutex
	msgs []spbMsg
}

func watchSparkplug(t *testing.T, brokerURL string) *spbWatcher {
	w := &spbWatcher{}
	c := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID("spb-watcher"))
	tok := c.Subscribe(sparkplug.Namespace+"/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		topic, err := sparkplug.ParseTopic(m.Topic())
		if err != nil {
			t.Errorf("topic %q: %v", m.Topic(), err)
			return
		}
		info, err := sparkplug.Decode(m.Payload())
		if err != nil {
			t.Errorf("payload on %q: %v", m.Topic(), err)
			return
		}
		w.mu.Lock()
		w.msgs = append(w.msgs, spbMsg{topic, info, time.Now()})
		w.mu.Unlock()
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return w
}

// next waits for the (i+1)-th message and returns it.
func (w *spbWatcher) next(t *testing.T, i int, timeout time.Duration) spbMsg {
	t.Helper()
	testenv.WaitFor(t, timeout, fmt.Sprintf("message %d", i+1), func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.msgs) > i
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.msgs[i]
}

func (w *spbWatcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.msgs)
}

func expect(t *testing.T, got spbMsg, kind sparkplug.Kind, device string, bdSeq int64, seq int64) {
	t.Helper()
	if got.topic.Group != "plant" || got.topic.Node != "edge1" || got.topic.Kind != kind || got.topic.Device != device ||
		got.info.Seq != seq || (kind == sparkplug.NBirth || kind == sparkplug.NDeath) != got.info.HasBdSeq ||
		(got.info.HasBdSeq && got.info.BdSeq != bdSeq) {
		t.Fatalf("got %v, want %s/%s bdSeq=%d seq=%d", got, kind, device, bdSeq, seq)
	}
}

// TestEdgeNodeBirthsAndDies proves the edge node against Mosquitto: births
// in order with one bdSeq, data with the next seqs, the NDEATH will with
// that bdSeq once the connection is cut, a rebirth with the next bdSeq,
// and a stale death that carries the old one.
func TestEdgeNodeBirthsAndDies(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true})
	w := watchSparkplug(t, env.Mosquitto.URL)
	const keepAlive = time.Second
	n := testenv.NewEdgeNode(t, env.Mosquitto.URL, "plant", "edge1", []string{"pump", "fan"}, keepAlive)

	expect(t, w.next(t, 0, 5*time.Second), sparkplug.NBirth, "", 0, 0)
	expect(t, w.next(t, 1, 5*time.Second), sparkplug.DBirth, "pump", 0, 1)
	expect(t, w.next(t, 2, 5*time.Second), sparkplug.DBirth, "fan", 0, 2)
	n.Data("pump")
	n.NodeData()
	n.DeviceDeath("fan")
	expect(t, w.next(t, 3, 5*time.Second), sparkplug.DData, "pump", 0, 3)
	expect(t, w.next(t, 4, 5*time.Second), sparkplug.NData, "", 0, 4)
	expect(t, w.next(t, 5, 5*time.Second), sparkplug.DDeath, "fan", 0, 5)

	killed := time.Now()
	n.Kill()
	death := w.next(t, 6, keepAlive*3/2+time.Second)
	expect(t, death, sparkplug.NDeath, "", 0, -1)
	t.Logf("NDEATH %v after Kill", death.at.Sub(killed))

	n.Rebirth()
	if n.BdSeq() != 1 {
		t.Fatalf("BdSeq after Rebirth = %d, want 1", n.BdSeq())
	}
	expect(t, w.next(t, 7, 5*time.Second), sparkplug.NBirth, "", 1, 0)
	expect(t, w.next(t, 8, 5*time.Second), sparkplug.DBirth, "pump", 1, 1)
	expect(t, w.next(t, 9, 5*time.Second), sparkplug.DBirth, "fan", 1, 2)

	n.PublishStaleDeath(0)
	expect(t, w.next(t, 10, 5*time.Second), sparkplug.NDeath, "", 0, -1)
	testenv.Never(t, 300*time.Millisecond, "another message", func() bool { return w.count() > 11 })
}

// TestEdgeNodeUnplugged proves that a pulled cable, no socket closed, ends
// in the NDEATH will once the broker's keep-alive runs out, and that the
// node comes back with the next bdSeq.
func TestEdgeNodeUnplugged(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true})
	w := watchSparkplug(t, env.Mosquitto.URL)
	const keepAlive = time.Second
	n := testenv.NewEdgeNode(t, env.Mosquitto.URL, "plant", "edge1", nil, keepAlive)
	expect(t, w.next(t, 0, 5*time.Second), sparkplug.NBirth, "", 0, 0)

	unplugged := time.Now()
	n.Unplug()
	// The broker gives up 1.5 keep-alives after the last packet it read;
	// Mosquitto looks at keep-alives about once a second.
	death := w.next(t, 1, keepAlive*3/2+2*time.Second)
	expect(t, death, sparkplug.NDeath, "", 0, -1)
	if d := death.at.Sub(unplugged); d < keepAlive/2 {
		t.Errorf("NDEATH %v after the cable was pulled, before the keep-alive could run out", d)
	}
	t.Logf("NDEATH %v after Unplug", death.at.Sub(unplugged))

	n.Rebirth()
	expect(t, w.next(t, 2, 5*time.Second), sparkplug.NBirth, "", 1, 0)
}

// TestEdgeNodeSeqWraps proves seq counts 0..255 and wraps.
func TestEdgeNodeSeqWraps(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true})
	w := watchSparkplug(t, env.Mosquitto.URL)
	n := testenv.NewEdgeNode(t, env.Mosquitto.URL, "plant", "edge1", []string{"pump"}, 5*time.Second)
	for range 256 {
		n.Data("pump")
	}
	expect(t, w.next(t, 255, 10*time.Second), sparkplug.DData, "pump", 0, 255)
	expect(t, w.next(t, 256, 10*time.Second), sparkplug.DData, "pump", 0, 0)
	expect(t, w.next(t, 257, 10*time.Second), sparkplug.DData, "pump", 0, 1)
}

// TestEdgeNodeLeavesNothingRunning proves the node's clients and proxy stop
// when its test ends, whether it was killed, unplugged or left connected.
func TestEdgeNodeLeavesNothingRunning(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true})
	before := testenv.IgnoreCurrent()
	t.Run("node", func(t *testing.T) {
		n := testenv.NewEdgeNode(t, env.Mosquitto.URL, "plant", "edge1", []string{"pump"}, time.Second)
		n.Kill()
		n.Rebirth()
		n.PublishStaleDeath(0)
		n.Unplug()
		n.Rebirth()
		n.Data("pump")
	})
	testenv.VerifyNone(t, before)
}
