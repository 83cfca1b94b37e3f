//go:build demo

package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/sparkplug"
	"github.com/sigwatch/sigwatch/shard"
)

// The demo's Sparkplug B edge node: plant-1/edge-1 with d00..d09.
const (
	demoSpBGroup   = "plant-1"
	demoSpBNode    = "edge-1"
	demoSpBDevices = 10
)

// demoNode is a Sparkplug B edge node as the specification has one behave:
// at each connection it sets its NDEATH (that connection's bdSeq, 0 first,
// one more each time) as its will, publishes NBIRTH and a DBIRTH per
// device, then a DDATA now and then (its devices report by exception). Its
// socket is its own, so the demo can end the connection as a crash does:
// no DISCONNECT reaches the broker, which publishes the will.
type demoNode struct {
	broker  string // host:port
	out     io.Writer
	devices []string

	mu     sync.Mutex // serializes seq with the publishes it numbers
	client mqtt.Client
	conn   net.Conn // the current connection's socket
	conns  int
	bdSeq  uint64
	seq    uint64
	deaths int
	births int
}

func newDemoNode(brokerURL string, out io.Writer) (*demoNode, error) {
	u, err := url.Parse(brokerURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("edge node: broker %q is not tcp://host:port", brokerURL)
	}
	n := &demoNode{broker: u.Host, out: out}
	for i := range demoSpBDevices {
		n.devices = append(n.devices, fmt.Sprintf("d%02d", i))
	}
	return n, nil
}

// name is the node's sigwatch id, also its devices' group.
func (n *demoNode) name() string { return demoSpBGroup + "/" + demoSpBNode }

// run connects the node and follows the demo's script until ctx is done:
// its connection dies at firstDeath, it comes back down later, and again
// every every.
func (n *demoNode) run(ctx context.Context, firstDeath, down, every time.Duration) error {
	if err := n.connect(); err != nil {
		return err
	}
	defer n.stop()
	fmt.Fprintf(n.out, "      edge node %s born: NBIRTH (bdSeq 0) and %d DBIRTHs; its devices report by exception, so a quiet one is not lost while its node lives\n",
		n.name(), len(n.devices))
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 29))
	data := time.NewTicker(700 * time.Millisecond)
	defer data.Stop()
	dies := time.NewTimer(firstDeath)
	defer dies.Stop()
	var back <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-data.C:
			if rng.IntN(3) == 0 {
				n.publish(sparkplug.DData, n.devices[rng.IntN(len(n.devices))], func(seq uint64) []byte {
					return sparkplug.DataPayload(seq, time.Now().UnixMilli())
				})
			}
		case <-dies.C:
			// Said first: the lost events follow within milliseconds.
			fmt.Fprintf(n.out, "      edge node %s lost its connection, no DISCONNECT sent: the broker publishes its will, an NDEATH (bdSeq %d), which declares it and its %d devices lost at once, reason death: one storm, one alarm\n",
				n.name(), n.currentBdSeq(), len(n.devices))
			n.kill()
			back = time.After(down)
			dies.Reset(every)
		case <-back:
			back = nil
			if err := n.connect(); err != nil {
				fmt.Fprintf(n.out, "      edge node %s could not reconnect: %v\n", n.name(), err)
				continue
			}
			fmt.Fprintf(n.out, "      edge node %s reconnected: its NBIRTH (bdSeq %d) and %d DBIRTHs bring it and its devices back\n",
				n.name(), n.currentBdSeq(), len(n.devices))
		}
	}
}

// connect makes a new connection with the next bdSeq and publishes the
// births.
func (n *demoNode) connect() error {
	n.mu.Lock()
	bdSeq := uint64(0)
	if n.conns > 0 {
		bdSeq = n.bdSeq + 1
	}
	n.conns++
	n.bdSeq, n.seq = bdSeq, 0
	n.mu.Unlock()
	death := sparkplug.Topic{Group: demoSpBGroup, Kind: sparkplug.NDeath, Node: demoSpBNode}.String()
	// One client id for the node, as a real one keeps.
	o := mqtt.NewClientOptions().AddBroker("tcp://"+n.broker).
		SetClientID("spb-"+demoSpBGroup+"-"+demoSpBNode).
		SetCleanSession(true).
		SetKeepAlive(5*time.Second).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetBinaryWill(death, sparkplug.DeathPayload(bdSeq, time.Now().UnixMilli()), 1, false).
		SetCustomOpenConnectionFn(func(u *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			c, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
			if err == nil {
				n.mu.Lock()
				n.conn = c
				n.mu.Unlock()
			}
			return c, err
		})
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return fmt.Errorf("edge node %s: connecting to the broker: %v", n.name(), tok.Error())
	}
	n.mu.Lock()
	n.client = c
	n.births++
	n.mu.Unlock()
	n.publish(sparkplug.NBirth, "", func(seq uint64) []byte {
		return sparkplug.BirthPayload(bdSeq, seq, time.Now().UnixMilli(), "temperature")
	})
	for _, d := range n.devices {
		n.publish(sparkplug.DBirth, d, func(seq uint64) []byte {
			return sparkplug.DeviceBirthPayload(seq, time.Now().UnixMilli(), "value")
		})
	}
	return nil
}

// kill closes the node's socket under its client, as a crash does.
func (n *demoNode) kill() {
	n.mu.Lock()
	c, conn := n.client, n.conn
	n.client, n.conn = nil, nil
	n.deaths++
	n.mu.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
	if c != nil {
		// Once the client has seen its connection end, Disconnect only
		// stops its goroutines: nothing reaches the broker.
		for end := time.Now().Add(5 * time.Second); c.IsConnectionOpen() && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
		}
		c.Disconnect(0)
	}
}

// stop disconnects the node cleanly as the demo ends.
func (n *demoNode) stop() {
	n.mu.Lock()
	c := n.client
	n.client = nil
	n.mu.Unlock()
	if c != nil {
		c.Disconnect(100)
	}
}

func (n *demoNode) currentBdSeq() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.bdSeq
}

// intro says what the node does and when; with no node (nil), why not.
func (n *demoNode) intro(out io.Writer, broker string, dies, down, every time.Duration) {
	if n == nil {
		fmt.Fprintf(out, "(The Sparkplug B edge node needs Mosquitto, which keeps one order per session; with the %s it is left out.)\n", broker)
		return
	}
	fmt.Fprintf(out, `A Sparkplug B edge node, %s, with %d devices reporting by exception,
is watched by its births and deaths: a quiet device of a live node is never
lost. %v in, its connection dies without a DISCONNECT: the broker publishes
its will, an NDEATH, which declares the node and its devices lost at once,
reason death, in one storm with one alarm. %v later it reconnects with the
next bdSeq, and its births bring them all back. This repeats every %v.
`, n.name(), len(n.devices), dies, down, every)
}

// summary says how often the node died and was born again.
func (n *demoNode) summary(out io.Writer) {
	if n == nil {
		return
	}
	n.mu.Lock()
	deaths, rebirths := n.deaths, max(0, n.births-1)
	n.mu.Unlock()
	fmt.Fprintf(out, "Edge node %s: %d connection deaths, each an NDEATH declaring it and its %d devices lost (reason death), and %d rebirths.\n",
		n.name(), deaths, len(n.devices), rebirths)
}

// publish sends a message of kind with the next seq, at QoS 0 as the
// specification has births and data go; while the node is down, nothing.
func (n *demoNode) publish(kind sparkplug.Kind, device string, payload func(seq uint64) []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.client == nil {
		return
	}
	seq := n.seq
	n.seq = (n.seq + 1) % 256
	topic := sparkplug.Topic{Group: demoSpBGroup, Kind: kind, Node: demoSpBNode, Device: device}.String()
	n.client.Publish(topic, 0, false, payload(seq)).WaitTimeout(5 * time.Second)
}

// ofNode says whether id is the edge node's or one of its devices'.
func (w *watch) ofNode(id string) bool {
	return w.node != "" && (id == w.node || strings.HasPrefix(id, w.node+"/"))
}

// nodeLost prints a lost device of the edge node with its reason.
func (w *watch) nodeLost(ev dispatch.Lost) {
	fmt.Fprintf(w.out, "      lost  %s  (%s)\n", ev.Device, reasonOf(ev.Reason))
}

// nodeBack counts the edge node's devices coming back and says so once
// all are: one line for a rebirth rather than one per device.
func (w *watch) nodeBack() {
	w.nodeRecovered++
	if w.lostCount["group "+w.node] > 0 {
		return
	}
	fmt.Fprintf(w.out, "      recovered  %s and its %d devices, by its births\n", w.node, max(0, w.nodeRecovered-1))
	w.nodeRecovered = 0
}

func reasonOf(r string) string {
	if r == "" {
		return shard.ReasonSilence
	}
	return r
}
