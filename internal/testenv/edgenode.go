package testenv

import (
	"net/url"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/internal/sparkplug"
)

// EdgeNode is a Sparkplug B edge node with devices, as the specification
// has one behave, connected to a broker through a Proxy of its own so that
// a test can end its connection as a crash, a cable pull or a network
// failure does. Call its methods from the test's goroutine.
//
// bdSeq is 0 on the first connection and one more on each later one. At
// connect the node sets its NDEATH (QoS 1, not retained, carrying that
// connection's bdSeq) as its will, then publishes NBIRTH (the same bdSeq,
// seq 0) and a DBIRTH per device; every later message takes the next seq,
// wrapping after 255. Births and data go at QoS 0, as the specification
// says; the client never reconnects by itself.
type EdgeNode struct {
	Proxy *Proxy // the node's way to the broker

	t         testing.TB
	broker    string // host:port
	group     string
	node      string
	devices   []string
	keepAlive time.Duration
	scanRate  time.Duration // said in its NBIRTH when set

	mu     sync.Mutex
	client mqtt.Client
	conns  int    // connections made
	bdSeq  uint64 // the current connection's
	seq    uint64 // the next message's
}

// NewEdgeNode connects an edge node of group with devices to the broker at
// brokerURL (tcp://host:port) through a new Proxy, and publishes its
// births. keepAlive is the MQTT keep-alive it asks for (whole seconds; the
// broker declares it gone after 1.5 times that without a packet). It
// disconnects when the test ends.
func NewEdgeNode(t testing.TB, brokerURL, group, node string, devices []string, keepAlive time.Duration) *EdgeNode {
	t.Helper()
	return NewScanningEdgeNode(t, brokerURL, group, node, devices, keepAlive, 0)
}

// NewScanningEdgeNode is NewEdgeNode for a node that says in its NBIRTH
// that it publishes its data every scanRate (Node Control/Scan Rate); 0:
// it says nothing, and reports by exception.
func NewScanningEdgeNode(t testing.TB, brokerURL, group, node string, devices []string, keepAlive, scanRate time.Duration) *EdgeNode {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil || (u.Scheme != "tcp" && u.Scheme != "mqtt") || u.Host == "" {
		t.Fatalf("testenv: edge node: broker URL %q is not tcp://host:port", brokerURL)
	}
	n := &EdgeNode{t: t, broker: u.Host, group: group, node: node, devices: devices, keepAlive: keepAlive, scanRate: scanRate}
	n.Proxy = NewProxy(t, u.Host)
	t.Cleanup(func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.client != nil {
			n.client.Disconnect(100)
		}
	})
	n.connect()
	return n
}

// BdSeq is the bdSeq of the node's current (or last) connection.
func (n *EdgeNode) BdSeq() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.bdSeq
}

// Topic is the topic of a message of kind from the node, or from device
// for the device kinds.
func (n *EdgeNode) Topic(kind sparkplug.Kind, device string) string {
	if !kind.Device() {
		device = ""
	}
	return sparkplug.Topic{Group: n.group, Kind: kind, Node: n.node, Device: device}.String()
}

// NodeData publishes an NDATA.
func (n *EdgeNode) NodeData() {
	n.t.Helper()
	n.publish(sparkplug.NData, "", func(seq uint64) []byte { return sparkplug.DataPayload(seq, unixMs()) })
}

// Data publishes a DDATA for device.
func (n *EdgeNode) Data(device string) {
	n.t.Helper()
	n.publish(sparkplug.DData, device, func(seq uint64) []byte { return sparkplug.DataPayload(seq, unixMs()) })
}

// DeviceDeath publishes a DDEATH for device: the node is up, the device is
// gone.
func (n *EdgeNode) DeviceDeath(device string) {
	n.t.Helper()
	n.publish(sparkplug.DDeath, device, func(seq uint64) []byte { return sparkplug.DataPayload(seq, unixMs()) })
}

// DeviceBirth publishes a DBIRTH for device, as after its DDEATH.
func (n *EdgeNode) DeviceBirth(device string) {
	n.t.Helper()
	n.publish(sparkplug.DBirth, device, func(seq uint64) []byte {
		return sparkplug.DeviceBirthPayload(seq, unixMs(), "value")
	})
}

// Kill closes the node's connection at the proxy, both ways at once, as a
// crash or a network failure does: no DISCONNECT reaches the broker, which
// sees the socket end and publishes the node's NDEATH will. It returns once
// the client knows it is down.
func (n *EdgeNode) Kill() {
	n.t.Helper()
	n.Proxy.Cut(0)
	n.waitDown()
}

// Unplug stops all traffic at the proxy with the connection left open, as
// a pulled cable does: the broker publishes the NDEATH will only once the
// keep-alive runs out (1.5 times it). It returns at once; the client finds
// out by its own pings. Rebirth plugs the cable back.
func (n *EdgeNode) Unplug() { n.Proxy.Hold() }

// Rebirth connects the node again with the next bdSeq and publishes its
// births. A node still connected is killed first, so the broker publishes
// the old connection's will, as it would for a node that restarted.
func (n *EdgeNode) Rebirth() {
	n.t.Helper()
	n.Proxy.Cut(0)
	n.Proxy.Release()
	n.waitDown()
	n.connect()
}

// PublishStaleDeath publishes, from a client of its own straight to the
// broker, an NDEATH for the node carrying bdSeq: a death from a connection
// older than the current one, which a host must ignore.
func (n *EdgeNode) PublishStaleDeath(bdSeq uint64) {
	n.t.Helper()
	o := mqtt.NewClientOptions().AddBroker("tcp://" + n.broker).
		SetClientID("stale-" + n.group + "-" + n.node).SetAutoReconnect(false)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		n.t.Fatalf("testenv: edge node %s: stale death: connect: %v", n.node, tok.Error())
	}
	defer c.Disconnect(100)
	tok := c.Publish(n.Topic(sparkplug.NDeath, ""), 1, false, sparkplug.DeathPayload(bdSeq, unixMs()))
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		n.t.Fatalf("testenv: edge node %s: stale death: publish: %v", n.node, tok.Error())
	}
}

// connect makes a new connection with the next bdSeq (0 for the first)
// and publishes the births.
func (n *EdgeNode) connect() {
	n.t.Helper()
	n.mu.Lock()
	bdSeq := uint64(0)
	if n.conns > 0 {
		bdSeq = n.bdSeq + 1
	}
	n.conns++
	n.bdSeq, n.seq = bdSeq, 0
	n.mu.Unlock()

	// One client id per node, as a real node keeps: a new connection takes
	// over a session the broker still holds, and ends it with its will.
	o := mqtt.NewClientOptions().AddBroker("tcp://"+n.Proxy.Addr).
		SetClientID("spb-"+n.group+"-"+n.node).
		SetCleanSession(true).
		SetKeepAlive(n.keepAlive).
		SetPingTimeout(n.keepAlive).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetBinaryWill(n.Topic(sparkplug.NDeath, ""), sparkplug.DeathPayload(bdSeq, unixMs()), 1, false)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		n.t.Fatalf("testenv: edge node %s: connect: %v", n.node, tok.Error())
	}
	n.mu.Lock()
	n.client = c
	n.mu.Unlock()
	n.publish(sparkplug.NBirth, "", func(seq uint64) []byte {
		if n.scanRate > 0 {
			return sparkplug.PeriodicBirthPayload(bdSeq, seq, unixMs(), n.scanRate.Milliseconds(), "value")
		}
		return sparkplug.BirthPayload(bdSeq, seq, unixMs(), "value")
	})
	for _, d := range n.devices {
		n.DeviceBirth(d)
	}
}

// publish sends a message of kind with the next seq, at QoS 0.
func (n *EdgeNode) publish(kind sparkplug.Kind, device string, payload func(seq uint64) []byte) {
	n.t.Helper()
	n.mu.Lock()
	c, seq := n.client, n.seq
	n.seq = (n.seq + 1) % 256
	n.mu.Unlock()
	tok := c.Publish(n.Topic(kind, device), 0, false, payload(seq))
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		n.t.Fatalf("testenv: edge node %s: publish %s: %v", n.node, kind, tok.Error())
	}
}

// waitDown waits until the client has seen its connection end.
func (n *EdgeNode) waitDown() {
	n.t.Helper()
	n.mu.Lock()
	c := n.client
	n.mu.Unlock()
	WaitFor(n.t, 10*time.Second, "the edge node's client to see its connection end", func() bool {
		return !c.IsConnectionOpen()
	})
	c.Disconnect(0) // stops the client's goroutines; nothing reaches the broker
}

func unixMs() int64 { return time.Now().UnixMilli() }
