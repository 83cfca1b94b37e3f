package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// lines collects the lines a process writes to one of its outputs.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) read(r *os.File) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l.mu.Lock()
		l.all = append(l.all, sc.Text())
		l.mu.Unlock()
	}
}

// with returns the lines that hold every one of want.
func (l *lines) with(want ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.all {
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(s, w)
		}
		if ok {
			out = append(out, s)
		}
	}
	return out
}

// startEvents runs `sigwatch events` with args against the API at addr.
func startEvents(t *testing.T, addr string, args ...string) (stdout, stderr *lines) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"events"}, args...)...)
	cmd.Env = append(os.Environ(), "SIGWATCH_API=http://"+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, stderr = &lines{}, &lines{}
	var wg sync.WaitGroup
	for _, l := range []*lines{stdout, stderr} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		if l == stdout {
			cmd.Stdout = w
		} else {
			cmd.Stderr = w
		}
		wg.Go(func() { l.read(r); r.Close() })
		t.Cleanup(func() { w.Close() })
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("sigwatch events: stdout %q, stderr %q", stdout.with(), stderr.with())
		}
	})
	return stdout, stderr
}

// TestEventsFollowsLost: `sigwatch events --lost` prints a silenced device's
// lost event as one human line, leaves out other kinds, and when its
// sigwatch dies and another takes its address, reconnects and goes on
// after the last event it printed, printing none twice.
func TestEventsFollowsLost(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	settings := []string{"SIGWATCH_THRESHOLDS_DEFAULT=1s", "SIGWATCH_HTTP_ADDR=" + addr}
	a := startProc(t, env, "a", settings...)
	testenv.WaitFor(t, 20*time.Second, "the API", func() bool {
		_, err := runCLI(t, addr, "stats")
		return err == nil
	})
	out, errs := startEvents(t, addr, "--lost")
	d := startDevices(t, env.Mosquitto.URL, 2, 200*time.Millisecond)
	testenv.WaitFor(t, 10*time.Second, "both devices watched", func() bool {
		o1, err1 := runCLI(t, addr, "device", "get", d.ids[0], "--json")
		o2, err2 := runCLI(t, addr, "device", "get", d.ids[1], "--json")
		return err1 == nil && err2 == nil && strings.Contains(o1, `"watched": true`) && strings.Contains(o2, `"watched": true`)
	})
	d.silence(d.ids[0])
	testenv.WaitFor(t, 10*time.Second, d.ids[0]+" lost in sigwatch events", func() bool {
		return len(out.with(" lost ", d.ids[0], "type=-", "silent ")) == 1
	})
	if got := out.with("alarm"); len(got) > 0 {
		t.Errorf("--lost printed alarm lines %q, want lost and recovered only", got)
	}

	// The stream breaks; another process serves the same address.
	a.kill()
	startProc(t, env, "b", settings...)
	testenv.WaitFor(t, 20*time.Second, "a reconnect", func() bool { return len(errs.with("reconnecting")) > 0 })
	d.silence(d.ids[1])
	testenv.WaitFor(t, 30*time.Second, d.ids[1]+" lost after the reconnect", func() bool {
		return len(out.with(" lost ", d.ids[1])) == 1
	})
	if got := out.with(" lost ", d.ids[0]); len(got) != 1 {
		t.Errorf("%s's lost printed %d times after the reconnect, want once: %q", d.ids[0], len(got), got)
	}
}

// TestCLIErrorsAndTimeouts: a refusal of the API is one plain line (its
// message, no JSON, no package prefix), a device never seen is named, and
// an API that does not answer is given up on at --timeout, saying so.
func TestCLIErrorsAndTimeouts(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, nil)
	waitReady(t, app)
	addr := app.HTTPAddr()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"device", "get", "nope"}, "sigwatch: device not known\n"},
		{[]string{"device", "threshold", "typo-1", "90s"}, "sigwatch: device \"typo-1\" not known: it never signalled, or was removed; check the id\n"},
		{[]string{"device", "group", "typo-1", "g1"}, "sigwatch: device \"typo-1\" not known: it never signalled, or was removed; check the id\n"},
		{[]string{"timer", "set", "q", "$sigwatch-x", "--after", "1s"}, "sigwatch: timer ids starting with $sigwatch- are sigwatch's own\n"},
		{[]string{"events", "--since", "1m", "--last", "2"}, "sigwatch: give --since or --last, not both\n"},
	} {
		out, err := runCLI(t, addr, append(c.args, "--token", "t0ken")...)
		if err == nil || out != c.want {
			t.Errorf("sigwatch %s: %v %q, want it refused with %q", strings.Join(c.args, " "), err, out, c.want)
		}
	}

	// A listener that accepts and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	for _, args := range [][]string{{"stats"}, {"shards", "status"}, {"alarm", "ls"}, {"events"}} {
		start := time.Now()
		out, err := runCLI(t, ln.Addr().String(), append(args, "--timeout", "300ms")...)
		if took := time.Since(start); err == nil || !strings.Contains(out, "within 300ms") || took > 5*time.Second {
			t.Errorf("sigwatch %s against a silent API: %v after %v: %q, want a refusal naming the 300ms timeout", strings.Join(args, " "), err, took, out)
		}
	}
}
