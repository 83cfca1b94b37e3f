package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/sigwatch/sigwatch/internal/servers"
)

// ChildEnv names the environment variable that makes the bench binary run as
// one of its child processes instead of the harness. The binary's main must
// check it first:
//
//	if role := os.Getenv(bench.ChildEnv); role != "" {
//		os.Exit(bench.RunChild(role))
//	}
const ChildEnv = "SIGWATCH_BENCH_CHILD"

// childConfigEnv carries the child's configuration, as JSON.
const childConfigEnv = "SIGWATCH_BENCH_CONFIG"

// RunChild runs the child role and returns its exit code. Every child stops
// when its standard input closes, so it never outlives the harness.
func RunChild(role string) int {
	var err error
	switch role {
	case "nats":
		err = natsChild()
	case "loadgen":
		err = loadgenChild()
	case "poller":
		err = pollerChild()
	default:
		err = fmt.Errorf("unknown child role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench child %s: %v\n", role, err)
		return 1
	}
	return 0
}

// child is a running child process: commands go to its standard input, and
// its standard output is read line by line by the goroutine that started it.
type child struct {
	role  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	log   string
	first string // the first line it printed (its ready line)

	// ask's state: one goroutine reads the answers, one command at a time.
	askMu   sync.Mutex
	askOnce sync.Once
	answers chan string
	seq     int
}

// startChild starts the bench binary again as role with cfg, and waits for
// its first line of output, which says it is ready.
func startChild(dir, role string, cfg any) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: start %s child: %w", role, err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, role+"-"+fmt.Sprint(time.Now().UnixNano())+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), ChildEnv+"="+role, childConfigEnv+"="+string(raw))
	cmd.Stderr = logf
	cmd.SysProcAttr = childAttr()
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s child: %w", role, err)
	}
	c := &child{role: role, cmd: cmd, in: in, out: bufio.NewScanner(outPipe), log: logPath}
	c.out.Buffer(make([]byte, 64<<10), 1<<20)
	ready := make(chan bool, 1)
	go func() {
		ready <- c.out.Scan()
	}()
	select {
	case ok := <-ready:
		if !ok {
			cmd.Process.Kill()
			cmd.Wait()
			return nil, fmt.Errorf("bench: %s child exited during start-up; end of %s:\n%s", role, logPath, servers.LogTail(logPath))
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("bench: %s child not ready after 20s; end of %s:\n%s", role, logPath, servers.LogTail(logPath))
	}
	c.first = c.out.Text()
	return c, nil
}

// send writes one command line to the child.
func (c *child) send(format string, args ...any) error {
	_, err := fmt.Fprintf(c.in, format+"\n", args...)
	return err
}

// stop closes the child's standard input, which stops it, and waits for it
// to exit; it kills it after grace.
func (c *child) stop(grace time.Duration) error {
	c.in.Close()
	exited := make(chan error, 1)
	go func() { exited <- c.cmd.Wait() }()
	select {
	case err := <-exited:
		return err
	case <-time.After(grace):
		c.cmd.Process.Kill()
		return <-exited
	}
}

// pid is the child's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// natsInfo is what the nats child prints once it is ready.
type natsInfo struct {
	URL     string `json:"url"`
	MQTTURL string `json:"mqtt_url"`
	Version string `json:"version"`
}

// natsChild runs an embedded nats-server with JetStream and the MQTT
// listener until standard input closes. It answers one command, "heap
// <tag>", with "heap <tag> <bytes>": the live heap after a forced GC.
func natsChild() error {
	var cfg struct{ Dir string }
	if err := json.Unmarshal([]byte(os.Getenv(childConfigEnv)), &cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	n, err := servers.StartNATS(cfg.Dir, servers.NATSOptions{JetStream: true, MQTT: true})
	if err != nil {
		return err
	}
	defer n.Shutdown()
	b, _ := json.Marshal(natsInfo{URL: n.URL, MQTTURL: n.MQTTURL, Version: server.VERSION})
	fmt.Println(string(b))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) != 2 || f[0] != "heap" {
			fmt.Printf("error unknown command %q\n", in.Text())
			continue
		}
		// The second collection frees what the first one's finalizers
		// released; HeapAlloc is then the live heap.
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		fmt.Printf("heap %s %d\n", f[1], ms.HeapAlloc)
	}
	return nil
}

// heap asks the nats child for the live heap of its process, nats-server
// and little else, after a forced GC, in bytes.
func (c *child) heap(ctx context.Context) (int64, error) {
	v, err := c.ask(ctx, "heap", time.Minute)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bench: %s child answered heap with %q", c.role, v)
	}
	return n, nil
}

// ask sends command cmd to the child and returns its answer. The command
// carries a tag the answer repeats, so that a late answer to a command
// given up on is never taken for the next one's. ask reads the child's
// output from then on: it is not for a child read with readLines.
func (c *child) ask(ctx context.Context, cmd string, timeout time.Duration) (string, error) {
	c.askMu.Lock()
	defer c.askMu.Unlock()
	c.askOnce.Do(func() {
		c.answers = make(chan string, 16)
		go func() {
			c.readLines(func(line string) { c.answers <- line })
			close(c.answers)
		}()
	})
	c.seq++
	tag := cmd + " " + strconv.Itoa(c.seq)
	if err := c.send("%s", tag); err != nil {
		return "", fmt.Errorf("bench: %s child: %s: %w", c.role, cmd, err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case line, ok := <-c.answers:
			if !ok {
				return "", fmt.Errorf("bench: %s child closed its output; end of %s:\n%s", c.role, c.log, servers.LogTail(c.log))
			}
			if v, ok := strings.CutPrefix(line, tag+" "); ok {
				return v, nil
			}
			if strings.HasPrefix(line, "error ") {
				return "", fmt.Errorf("bench: %s child: %s", c.role, line)
			}
		case <-t.C:
			return "", fmt.Errorf("bench: %s child: no answer to %s after %s", c.role, cmd, timeout)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// readLines hands each line the child prints to f until the child closes
// its output. The caller runs it on its own goroutine and owns it.
func (c *child) readLines(f func(line string)) {
	for c.out.Scan() {
		f(strings.TrimSpace(c.out.Text()))
	}
}
