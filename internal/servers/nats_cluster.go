package servers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// clusterReadyTimeout bounds how long a cluster start or a node restart waits for JetStream to
// be healthy: a first meta-leader election, or a restarted node catching up on its streams.
const clusterReadyTimeout = 30 * time.Second

// NATSCluster is a nats-server cluster with JetStream, every node a child process (the natsd
// helper, built once per process), so that a node can be killed with SIGKILL as a crash would
// and restarted on the same ports and store.
type NATSCluster struct {
	Dir   string // node<i> holds node i's store and log
	nodes []*natsNode
}

// natsNode is one node of a NATSCluster.
type natsNode struct {
	child // the current run; serialises Kill, Stop and Restart

	id, dir, bin string // id is the server name
	port         int    // client port
	httpPort     int    // monitoring port
	clusterPort  int    // route port; 0 for a server alone
	mqttPort     int    // MQTT listener port; 0 for none
	routes       string // the other nodes' route URLs
}

// StartNATSCluster starts size nodes (at least 3, so that a stream of 3 replicas keeps a quorum
// when one node is lost) in dir/node<i>, all routed to each other, and returns once every node
// reports JetStream healthy.
func StartNATSCluster(dir string, size int) (*NATSCluster, error) {
	if size < 3 {
		return nil, fmt.Errorf("servers: a nats cluster needs at least 3 nodes, got %d", size)
	}
	bin, err := natsdBinary()
	if err != nil {
		return nil, err
	}
	if dir, err = prepareDir(dir); err != nil {
		return nil, fmt.Errorf("servers: nats cluster dir: %w", err)
	}
	// Every node's routes name the others' route ports, so a port taken between FreePort and the
	// bind means starting the whole cluster again on new ports.
	for attempt := 1; ; attempt++ {
		c, err := startNATSCluster(dir, bin, size)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			return nil, fmt.Errorf("servers: start nats cluster: %w", err)
		}
	}
}

func startNATSCluster(dir, bin string, size int) (*NATSCluster, error) {
	c := &NATSCluster{Dir: dir}
	for i := range size {
		n := &natsNode{id: fmt.Sprintf("n%d", i), dir: filepath.Join(dir, fmt.Sprintf("node%d", i)), bin: bin}
		n.child.name = "nats " + n.id
		for _, p := range []*int{&n.port, &n.httpPort, &n.clusterPort} {
			port, err := FreePort()
			if err != nil {
				return nil, err
			}
			*p = port
		}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	for i, n := range c.nodes {
		var routes []string
		for j, o := range c.nodes {
			if j != i {
				routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(o.clusterPort))
			}
		}
		n.routes = strings.Join(routes, ",")
	}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			return nil, err
		}
	}
	for _, n := range c.nodes {
		if err := n.waitHealthy(); err != nil {
			return nil, err
		}
	}
	ok = true
	return c, nil
}

// start runs the node and waits until its monitoring port answers. The caller holds n.mu or
// owns n alone.
func (n *natsNode) start() error {
	args := []string{
		"-name", n.id, "-store", filepath.Join(n.dir, "jetstream"),
		"-port", strconv.Itoa(n.port), "-http", strconv.Itoa(n.httpPort),
	}
	if n.clusterPort != 0 {
		args = append(args, "-cluster", strconv.Itoa(n.clusterPort), "-routes", n.routes)
	}
	if n.mqttPort != 0 {
		args = append(args, "-mqtt", strconv.Itoa(n.mqttPort))
	}
	p, err := startProcess(n.bin, args, n.dir, n.logPath())
	if err != nil {
		return err
	}
	if err := p.waitReady(func() error { _, err := n.get("/varz"); return err }); err != nil {
		return err
	}
	n.cmd = p
	return nil
}

func (n *natsNode) logPath() string { return filepath.Join(n.dir, "nats.log") }

func (n *natsNode) url() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

// running reports whether the node's current run has not exited.
func (n *natsNode) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil && !n.cmd.exited()
}

// get fetches path from the node's monitoring port and returns the body of a 200 answer.
func (n *natsNode) get(path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(n.httpPort)+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s: %s", n.id, path, resp.Status, strings.TrimSpace(string(b)))
	}
	return b, nil
}

// waitHealthy waits until the node's /healthz answers 200: JetStream is up, the node knows the
// meta leader and its streams and consumers are current.
func (n *natsNode) waitHealthy() error {
	deadline := time.Now().Add(clusterReadyTimeout)
	for {
		_, err := n.get("/healthz")
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats %s not healthy after %v: %w; end of %s:\n%s", n.id, clusterReadyTimeout, err, n.logPath(), LogTail(n.logPath()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URLs returns the client URL of every node, in node order, running or not.
func (c *NATSCluster) URLs() []string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.url()
	}
	return urls
}

// URL returns every node's client URL, comma-separated, as nats.url and nats.Connect take them.
func (c *NATSCluster) URL() string { return strings.Join(c.URLs(), ",") }

// Name returns node i's server name, as stream and connection info report it.
func (c *NATSCluster) Name(i int) string { return c.nodes[i].id }

// LogPath returns the file node i logs to.
func (c *NATSCluster) LogPath(i int) string { return c.nodes[i].logPath() }

// Kill kills node i with SIGKILL, as a crash would, and waits until it has exited.
func (c *NATSCluster) Kill(i int) error { return c.nodes[i].kill() }

// Restart starts node i again on its ports and store, stopping it first if it still runs, and
// returns once it reports JetStream healthy: back in the cluster and caught up on its streams.
func (c *NATSCluster) Restart(i int) error {
	n := c.nodes[i]
	if err := n.restart(n.start); err != nil {
		return err
	}
	if err := n.waitHealthy(); err != nil {
		return fmt.Errorf("servers: restart %s: %w", n.child.name, err)
	}
	return nil
}

// Pause freezes node i (SIGSTOP), as a hung machine or a network partition would: its
// connections stay open and nothing answers on them. Resume lets it go on (SIGCONT).
func (c *NATSCluster) Pause(i int) error { return c.nodes[i].signal(syscall.SIGSTOP) }

// Resume continues a paused node.
func (c *NATSCluster) Resume(i int) error { return c.nodes[i].signal(syscall.SIGCONT) }

// Stop stops every node (SIGTERM, then SIGKILL after 5s), in parallel.
func (c *NATSCluster) Stop() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(func() { n.stop() })
	}
	wg.Wait()
}

// StreamLeader returns the index of the node that leads stream, as that node itself reports
// it, or -1 when no running node does (no stream, or an election under way).
func (c *NATSCluster) StreamLeader(stream string) (int, error) {
	var errs []error
	for i, n := range c.nodes {
		if !n.running() {
			continue
		}
		b, err := n.get("/jsz?accounts=true&streams=true")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var info server.JSInfo
		if err := json.Unmarshal(b, &info); err != nil {
			errs = append(errs, fmt.Errorf("%s jsz: %w", n.id, err))
			continue
		}
		for _, acc := range info.AccountDetails {
			for _, s := range acc.Streams {
				if s.Name == stream && s.Cluster != nil && s.Cluster.Leader == n.id {
					return i, nil
				}
			}
		}
	}
	if len(errs) > 0 {
		return -1, fmt.Errorf("servers: stream leader of %s: %w", stream, errors.Join(errs...))
	}
	return -1, nil
}

// ConnectedNode returns the index of the running node a client that named itself client
// (nats.Name) is connected to, or -1 when none is. With several such clients it returns the
// first node that has one.
func (c *NATSCluster) ConnectedNode(client string) (int, error) {
	var errs []error
	for i, n := range c.nodes {
		if !n.running() {
			continue
		}
		b, err := n.get("/connz?limit=100000")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var cz server.Connz
		if err := json.Unmarshal(b, &cz); err != nil {
			errs = append(errs, fmt.Errorf("%s connz: %w", n.id, err))
			continue
		}
		for _, ci := range cz.Conns {
			if ci.Name == client {
				return i, nil
			}
		}
	}
	if len(errs) > 0 {
		return -1, fmt.Errorf("servers: node of client %s: %w", client, errors.Join(errs...))
	}
	return -1, nil
}

var natsd struct {
	once sync.Once
	path string
	err  error
}

// natsdBinary builds the natsd helper once per process and returns its path. It is built into
// a fixed directory under the system's temporary directory, through a temporary name and a
// rename, so that test processes building it at the same time do not disturb each other.
func natsdBinary() (string, error) {
	natsd.once.Do(func() { natsd.path, natsd.err = buildNATSD() })
	return natsd.path, natsd.err
}

func buildNATSD() (string, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = "/usr/local/go/bin/go" // where the Makefile expects Go
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("sigwatch-natsd-%d", os.Getuid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("servers: build natsd: %w", err)
	}
	f, err := os.CreateTemp(dir, "natsd-*.tmp")
	if err != nil {
		return "", fmt.Errorf("servers: build natsd: %w", err)
	}
	tmp := f.Name()
	f.Close()
	defer os.Remove(tmp)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "build", "-o", tmp, "github.com/sigwatch/sigwatch/internal/servers/natsd")
	// Building by import path needs a directory inside the module: this file's, when the
	// source is at hand, else the working directory (a test's package directory).
	if _, file, _, ok := runtime.Caller(0); ok {
		if st, err := os.Stat(filepath.Dir(file)); err == nil && st.IsDir() {
			cmd.Dir = filepath.Dir(file)
		}
	}
	// The helper is not instrumented, whatever flags the test binary was built with.
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("servers: build natsd: %w\n%s", err, out)
	}
	path := filepath.Join(dir, "natsd")
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("servers: build natsd: %w", err)
	}
	return path, nil
}
