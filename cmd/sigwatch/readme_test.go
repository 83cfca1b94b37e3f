package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// firstDeviceBlock is the README's "Your first real device" walkthrough:
// the lines of the one sh block under that heading, each with its comment.
func firstDeviceBlock(t *testing.T) (lines, comments []string) {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	section, inBlock := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "## "):
			if section && len(lines) > 0 {
				return lines, comments
			}
			section = l == "## Your first real device"
		case section && strings.HasPrefix(l, "```"):
			if inBlock {
				return lines, comments
			}
			inBlock = l == "```sh"
		case section && inBlock && strings.TrimSpace(l) != "":
			cmd, comment, _ := strings.Cut(l, " #")
			lines = append(lines, strings.TrimSpace(cmd))
			comments = append(comments, strings.TrimSpace(comment))
		}
	}
	t.Fatal("README.md has no sh block under ## Your first real device")
	return nil, nil
}

// terminal is one line of the walkthrough running as a person would run it
// in a terminal of its own: its own process group, so that Ctrl-C reaches
// make and what make started.
type terminal struct {
	line string
	out  *output
	cmd  *exec.Cmd
	done chan struct{}
}

func runLine(t *testing.T, root, line string, env []string) *terminal {
	t.Helper()
	term := &terminal{line: line, out: &output{}, done: make(chan struct{})}
	term.cmd = exec.Command("sh", "-c", line)
	term.cmd.Dir = root
	term.cmd.Env = append(os.Environ(), env...)
	term.cmd.Stdout, term.cmd.Stderr = term.out, term.out
	term.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := term.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = term.cmd.Wait(); close(term.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-term.cmd.Process.Pid, syscall.SIGKILL)
		<-term.done
		if t.Failed() {
			t.Logf("--- %s ---\n%s", line, tail(term.out.String(), 4000))
		}
	})
	return term
}

func (term *terminal) exited() bool {
	select {
	case <-term.done:
		return true
	default:
		return false
	}
}

// TestReadmeFirstDevice runs the README's "Your first real device" block as
// written, line by line from the repository's root, each in a terminal of
// its own: `make run` brings up the servers and the service on the standard
// ports, `bin/sigwatch events --lost` follows, mosquitto_pub signals pump-1,
// and once pump-1 has been silent past its threshold (2 s here, from the
// environment, instead of deploy/sigwatch.yaml's 30 s) the events terminal
// shows it lost and the last line lists it. Ctrl-C then stops everything.
func TestReadmeFirstDevice(t *testing.T) {
	lines, comments := firstDeviceBlock(t)
	if len(lines) < 3 || lines[0] != "make run" {
		t.Fatalf("the walkthrough should start with make run: %q", lines)
	}
	for _, port := range []int{1883, 4222, 6379, 8080} {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("port %d is taken on a CI machine: %v", port, err)
			}
			t.Skipf("port %d is taken here, and the README's commands use the standard ports: %v", port, err)
		}
		ln.Close()
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"SIGWATCH_THRESHOLDS_DEFAULT=2s"}

	ready := func() bool {
		resp, err := http.Get("http://127.0.0.1:8080/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	var terms []*terminal
	var events *terminal
	for i, line := range lines {
		if i > 0 && strings.Contains(comments[i-1], "later") {
			// The line before says what to wait for: pump-1 shown lost.
			testenv.WaitFor(t, 30*time.Second, "the events terminal showing pump-1 lost", func() bool {
				return events != nil && strings.Contains(events.out.String(), "pump-1") &&
					strings.Contains(events.out.String(), "lost")
			})
		}
		term := runLine(t, root, line, env)
		terms = append(terms, term)
		if strings.HasPrefix(line, "bin/sigwatch events") {
			events = term
		}
		// A line either finishes (and must succeed) or keeps its terminal:
		// the next line waits for the service to be ready and for a kept
		// terminal to have settled.
		deadline := time.Now().Add(3 * time.Minute) // make run builds bin/sigwatch first
		for !term.exited() && !ready() && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if term.exited() {
			if code := term.cmd.ProcessState.ExitCode(); code != 0 {
				t.Fatalf("%q exited %d:\n%s", line, code, term.out.String())
			}
		} else {
			if !ready() {
				t.Fatalf("%q: the service was not ready within 3 minutes:\n%s", line, tail(term.out.String(), 4000))
			}
			time.Sleep(time.Second) // a following terminal connects
			if term.exited() && term.cmd.ProcessState.ExitCode() != 0 {
				t.Fatalf("%q exited %d:\n%s", line, term.cmd.ProcessState.ExitCode(), term.out.String())
			}
		}
	}
	last := terms[len(terms)-1]
	if !strings.Contains(last.out.String(), "pump-1") {
		t.Errorf("%q does not list pump-1:\n%s", last.line, last.out.String())
	}
	t.Logf("events terminal:\n%s", events.out.String())

	// Ctrl-C in each kept terminal, the service's last.
	for i := len(terms) - 1; i >= 0; i-- {
		term := terms[i]
		if term.exited() {
			continue
		}
		_ = syscall.Kill(-term.cmd.Process.Pid, syscall.SIGINT)
		select {
		case <-term.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%q still running 30s after Ctrl-C", term.line)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the standard ports free again", func() bool {
		for _, port := range []int{1883, 4222, 6379, 8080} {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				return false
			}
			ln.Close()
		}
		return true
	})
}
