package servers

import (
	"fmt"
	"net"
	"os"
	"strconv"
)

// NATSProcess is a nats-server with JetStream and an MQTT listener running alone as a child
// process (the natsd helper), so that a test can kill it with SIGKILL as a crash would and
// restart it on the same ports and store: the broker a fleet connects to, apart from the test's
// own process and its instrumentation.
type NATSProcess struct {
	URL      string // nats://host:port
	MQTTAddr string // host:port of the MQTT listener
	MQTTURL  string // tcp://host:port of the MQTT listener, for paho
	Dir      string // the store (Dir/jetstream) and nats.log
	node     *natsNode
}

// StartNATSProcess starts the server in dir (created if needed) and returns once JetStream is
// healthy.
func StartNATSProcess(dir string) (*NATSProcess, error) {
	bin, err := natsdBinary()
	if err != nil {
		return nil, err
	}
	if dir, err = prepareDir(dir); err != nil {
		return nil, fmt.Errorf("servers: nats process dir: %w", err)
	}
	n := &natsNode{id: "sigwatch", dir: dir, bin: bin}
	n.child.name = "nats"
	for _, p := range []*int{&n.port, &n.httpPort, &n.mqttPort} {
		if *p, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := n.start(); err != nil {
		return nil, fmt.Errorf("servers: start nats: %w", err)
	}
	if err := n.waitHealthy(); err != nil {
		n.stop()
		return nil, fmt.Errorf("servers: start nats: %w", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(n.mqttPort))
	return &NATSProcess{URL: n.url(), MQTTAddr: addr, MQTTURL: "tcp://" + addr, Dir: dir, node: n}, nil
}

// LogPath is the file the server logs to.
func (p *NATSProcess) LogPath() string { return p.node.logPath() }

// Kill kills the server with SIGKILL, as a crash would, and waits until it has exited.
func (p *NATSProcess) Kill() error { return p.node.kill() }

// Restart starts the server again on its ports and store, stopping it first if it still runs,
// and returns once JetStream is healthy again (its streams, and the MQTT sessions in them,
// recovered).
func (p *NATSProcess) Restart() error {
	if err := p.node.restart(p.node.start); err != nil {
		return err
	}
	if err := p.node.waitHealthy(); err != nil {
		return fmt.Errorf("servers: restart nats: %w", err)
	}
	return nil
}

// Stop stops the server (SIGTERM, then SIGKILL after a grace).
func (p *NATSProcess) Stop() { p.node.stop() }
