package servers

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// readyTimeout bounds how long a start or restart waits for a server to answer.
	readyTimeout = 10 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
	stopGrace = 5 * time.Second
	// startAttempts is how often a start is tried on a fresh port when the port it picked was
	// taken by someone else between FreePort and the server's bind.
	startAttempts = 5
)

// errAddrInUse marks a start that failed because the port was taken, so the caller may retry.
var errAddrInUse = errors.New("address already in use")

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. Another process may take
// it before the caller binds it; the Start functions retry on a new port when that happens.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("servers: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// onFreePort calls start with a free port. When start fails because the port was taken by
// someone else between FreePort and the server's bind, it tries again on a new port, up to
// startAttempts times. It returns the last error.
func onFreePort(start func(port int) error) error {
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return err
		}
		err = start(port)
		if err == nil || !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			return err
		}
	}
}

// extraBinDirs are searched after PATH: distributions install mosquitto in /usr/sbin, which is
// often not on a user's PATH, and Homebrew installs it in its own sbin.
var extraBinDirs = []string{"/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin", "/opt/homebrew/sbin", "/opt/homebrew/bin"}

// NotFoundError reports that none of the names given to LookPath is installed.
type NotFoundError struct {
	Name string // the first name asked for
}

func (e *NotFoundError) Error() string {
	return e.Name + " not found: run `make deps` (deploy/local/install.sh)"
}

// Unwrap lets callers test with errors.Is(err, exec.ErrNotFound).
func (e *NotFoundError) Unwrap() error { return exec.ErrNotFound }

// LookPath returns the path of the first of names found on PATH or in the usual system binary
// directories. The error says how to install the missing binary.
func LookPath(names ...string) (string, error) {
	if len(names) == 0 {
		return "", errors.New("servers: LookPath needs a name")
	}
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	for _, name := range names {
		for _, dir := range extraBinDirs {
			p := filepath.Join(dir, name)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", &NotFoundError{Name: names[0]}
}

// prepareDir makes dir absolute and creates it.
func prepareDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", err
	}
	return abs, nil
}

// locate finds the binary binName of the child server name and makes its directory dir
// absolute, creating it: what every child server needs before its first start.
func locate(name, binName, dir string) (bin, absDir string, err error) {
	if bin, err = LookPath(binName); err != nil {
		return "", "", err
	}
	if absDir, err = prepareDir(dir); err != nil {
		return "", "", fmt.Errorf("servers: %s dir: %w", name, err)
	}
	return bin, absDir, nil
}

// process is one run of a child server. Its exit is reaped by a goroutine that process owns; the
// goroutine ends when the child does, which kill guarantees.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the child has exited and been reaped
	err     error         // the result of cmd.Wait, valid once done is closed
}

// startProcess starts bin with args in dir, with stdout and stderr appended to logPath.
func startProcess(bin string, args []string, dir, logPath string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	// The child holds its own copy of the descriptor; ours is not needed after Start.
	defer logf.Close()
	fmt.Fprintf(logf, "==== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdin = nil
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := spawn(cmd.Start); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &process{name: filepath.Base(bin), cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits until the child is reaped. Killing a child that has already
// exited is not an error.
func (p *process) kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	<-p.done
	return nil
}

// stop sends SIGTERM, waits up to grace for the child to exit, then kills it.
func (p *process) stop(grace time.Duration) error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			<-p.done
			return nil
		}
		return p.kill()
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return p.kill()
	}
}

// child is a server that runs as a child process and can be killed, stopped and started again
// on the same port(s): what Redis and Mosquitto share. Its methods act on the current run,
// one at a time.
type child struct {
	name string     // the server, in errors: "redis", "mosquitto"
	mu   sync.Mutex // serialises kill, stop and restart
	cmd  *process   // the current run; nil before the first start
}

// kill kills the current run, if any, and waits until it has exited.
func (c *child) kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return nil
	}
	return c.cmd.kill()
}

// stop asks the current run, if any, to shut down (SIGTERM) and waits; it kills it after
// stopGrace.
func (c *child) stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return nil
	}
	return c.cmd.stop(stopGrace)
}

// restart stops the current run if it is still going, then calls start, which starts a new run
// on the same port(s) and sets c.cmd, as restartOnPort does.
func (c *child) restart(start func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil && !c.cmd.exited() {
		if err := c.cmd.stop(stopGrace); err != nil {
			return fmt.Errorf("servers: restart %s: %w", c.name, err)
		}
	}
	return restartOnPort(c.name, start)
}

// restartOnPort calls start until it succeeds, retrying for a few seconds while the port is
// still held, e.g. by a client that grabbed it as an ephemeral port during the outage.
func restartOnPort(what string, start func() error) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := start()
		if err == nil {
			return nil
		}
		if !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			return fmt.Errorf("servers: restart %s: %w", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitReady polls ready until it succeeds, the child exits or readyTimeout passes. When the child
// exits because its port was taken, the error wraps errAddrInUse.
func (p *process) waitReady(ready func() error) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		if p.exited() {
			tail := LogTail(p.logPath)
			err := fmt.Errorf("%s exited during start-up (%v); end of %s:\n%s", p.name, p.err, p.logPath, tail)
			if strings.Contains(strings.ToLower(tail), "address already in use") {
				return fmt.Errorf("%w: %w", errAddrInUse, err)
			}
			return err
		}
		err := ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			p.kill()
			return fmt.Errorf("%s not ready after %v: %w; end of %s:\n%s", p.name, readyTimeout, err, p.logPath, LogTail(p.logPath))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// LogTail returns about the last 2 KiB of the log at path, for error messages and for showing
// what a server said before a failing test removes its directory.
func LogTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	const max = 2048
	if st, err := f.Stat(); err == nil && st.Size() > max {
		f.Seek(st.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return strings.TrimRight(string(b), "\n")
}

// dialable reports whether a TCP connection to addr succeeds.
func dialable(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// redisDo sends one command to the Redis at addr on a new connection and returns a simple,
// integer or bulk-string reply. It exists so that this package can wait for Redis and set up a
// cluster without a client library.
func redisDo(addr, password string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	rd := bufio.NewReader(c)
	send := func(args ...string) (string, error) {
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := io.WriteString(c, b.String()); err != nil {
			return "", err
		}
		return readRESP(rd)
	}
	if password != "" {
		if _, err := send("AUTH", password); err != nil {
			return "", err
		}
	}
	return send(args...)
}

func readRESP(rd *bufio.Reader) (string, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("redis: empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New("redis: " + line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", fmt.Errorf("redis: bad bulk length %q", line)
		}
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	default:
		return "", fmt.Errorf("redis: unsupported reply %q", line)
	}
}

// runCommand runs a short-lived helper (redis-cli, mosquitto_passwd) to completion, with no
// stdin and a 30s limit, and returns its combined output.
func runCommand(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = sysProcAttr()
	err := spawn(cmd.Start)
	if err == nil {
		err = cmd.Wait()
	}
	return strings.TrimSpace(out.String()), err
}
