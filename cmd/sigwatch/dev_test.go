package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// output collects a child's stdout and stderr while it runs.
type output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// match waits for re in the output and returns its first group.
func (o *output) match(t *testing.T, timeout time.Duration, re *regexp.Regexp) string {
	t.Helper()
	var got string
	testenv.WaitFor(t, timeout, "output matching "+re.String(), func() bool {
		if m := re.FindStringSubmatch(o.String()); m != nil {
			got = m[1]
			return true
		}
		return false
	})
	return got
}

// startInteractive runs the sigwatch binary with args from the repository's
// root, as `make` does, and returns its output and a func that sends SIGINT
// (Ctrl-C) and returns the exit code.
func startInteractive(t *testing.T, env []string, args ...string) (*output, func() int) {
	t.Helper()
	out := &output{}
	cmd := exec.Command(binary, args...)
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("--- sigwatch %s output ---\n%s", args[0], tail(out.String(), 6000))
		}
	})
	interrupt := func() int {
		t.Helper()
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("sigwatch %s still running 20s after Ctrl-C", args[0])
		}
		return cmd.ProcessState.ExitCode()
	}
	return out, interrupt
}

// TestDevReportsAPublishedDeviceLost runs `sigwatch dev` (make run) on free
// ports with a 1s threshold from the environment: it says where the
// broker, the API, NATS, the config (deploy/sigwatch.yaml, by its real
// path) and the logs are, and again after --remind; a device published as
// mosquitto_pub would, on the README's devices/<id>/signal, is reported
// lost; Ctrl-C stops everything with exit code 0.
func TestDevReportsAPublishedDeviceLost(t *testing.T) {
	dir := t.TempDir()
	out, interrupt := startInteractive(t, []string{"SIGWATCH_THRESHOLDS_DEFAULT=1s"},
		"dev", "--ports", "free", "--dir", dir, "--remind", "2s")
	broker := out.match(t, 60*time.Second, regexp.MustCompile(`\(broker (tcp://127\.0\.0\.1:\d+), topic devices/<id>/signal\)`))
	status := out.match(t, time.Second, regexp.MustCompile(`status +(http://127\.0\.0\.1:\d+/) `))
	cfg, err := filepath.Abs(filepath.Join("..", "..", "deploy", "sigwatch.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"mosquitto_pub -p ", "-t devices/pump-1/signal -m hi", "bin/sigwatch events", "nats sub -s nats://127.0.0.1:",
		"config   " + cfg + " ", "silence threshold 1s", "logs     " + dir + " ",
		"export SIGWATCH_API=" + strings.TrimSuffix(status, "/"), "export SIGWATCH_NATS_URL=nats://127.0.0.1:",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("sigwatch dev's output lacks %q", want)
		}
	}
	resp, err := http.Get(status)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %s", status, resp.Status)
	}

	c := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(broker).SetClientID("dev-test-device"))
	if tok := c.Publish("devices/pump-7/signal", 1, false, "hi"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	out.match(t, 15*time.Second, regexp.MustCompile(`(lost +pump-7) `))
	testenv.WaitFor(t, 10*time.Second, "where everything is, printed again", func() bool {
		return strings.Count(out.String(), "  publish  ") >= 2
	})
	if code := interrupt(); code != 0 {
		t.Errorf("sigwatch dev exited %d on Ctrl-C, want 0", code)
	}
	if !strings.Contains(out.String(), fmt.Sprintf("kept in %s", dir)) {
		t.Errorf("sigwatch dev did not say where its logs are kept")
	}
	if _, err := os.Stat(filepath.Join(dir, "sigwatch.log")); err != nil {
		t.Errorf("the service's log: %v", err)
	}
}

// TestDemoShowsLostDevices runs `sigwatch demo` as a user would, on free
// ports: it says where to publish (the README's devices/<id>/signal), the
// status page, how to subscribe, the config make run uses and its log dir,
// and again after --remind; its fleet's devices have types and gateways; a
// device the user publishes once on the README's topic is watched and
// reported lost; a dark gateway's storm ends with the count it reached,
// never fewer than it started with; Ctrl-C exits 0 and names the log dir.
func TestDemoShowsLostDevices(t *testing.T) {
	out, interrupt := startInteractive(t, nil, "demo", "--ports", "free", "--dir", t.TempDir(), "--devices", "500", "--threshold", "1s",
		"--gateway-every", "3s", "--remind", "3s")
	broker := out.match(t, 60*time.Second, regexp.MustCompile(`\(broker (tcp://127\.0\.0\.1:\d+), topic devices/<id>/signal\)`))
	status := out.match(t, time.Second, regexp.MustCompile(`status +(http://127\.0\.0\.1:\d+)/ `))
	logs := out.match(t, time.Second, regexp.MustCompile(`logs +(\S+) `))
	cfg, err := filepath.Abs(filepath.Join("..", "..", "deploy", "sigwatch.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-t devices/pump-1/signal -m hi", "bin/sigwatch events", "nats sub -s nats://127.0.0.1:", "config   " + cfg + " "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}

	c := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(broker).SetClientID("demo-test-device"))
	if tok := c.Publish("devices/mine-1/signal", 1, false, "hi"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	out.match(t, 15*time.Second, regexp.MustCompile(`(your device mine-1: lost)`))
	for id, want := range map[string][2]string{"mine-1": {"", ""}, "dev-000000": {"meter", "gw-0"}, "dev-000051": {"tracker", "gw-1"}} {
		var v struct{ Type, Group string }
		resp, err := http.Get(status + "/v1/devices/" + id)
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil || v.Type != want[0] || v.Group != want[1] {
			t.Errorf("GET /v1/devices/%s: %+v, %v; want type %q, group %q", id, v, err, want[0], want[1])
		}
	}
	ended := regexp.MustCompile(`storm ended: group (gw-\d+), (\d+) of its 50 devices were lost at the worst`)
	out.match(t, 30*time.Second, ended)
	testenv.WaitFor(t, 10*time.Second, "where everything is, printed again", func() bool {
		return strings.Count(out.String(), "  publish  ") >= 2
	})
	if code := interrupt(); code != 0 {
		t.Errorf("sigwatch demo exited %d on Ctrl-C, want 0", code)
	}
	text := out.String()
	if !strings.Contains(text, "Summary:") || strings.Contains(text, "Summary: 0 lost") {
		t.Errorf("demo reported no lost device")
	}
	if !strings.Contains(text, "kept in "+logs) {
		t.Errorf("the demo did not name its log dir %s at the end", logs)
	}
	if _, err := os.Stat(filepath.Join(logs, "sigwatch.log")); err != nil {
		t.Errorf("the demo's log: %v", err)
	}
	// A storm ends with the most of its gateway lost at once, at least what
	// it started with: never "25 of 50" at the start and "24 of 50" at the end.
	started := regexp.MustCompile(`storm started: group (gw-\d+), (\d+) of its 50 devices lost so far`)
	first := map[string]int{}
	for _, m := range started.FindAllStringSubmatch(text, -1) {
		n, _ := strconv.Atoi(m[2])
		if _, ok := first[m[1]]; !ok {
			first[m[1]] = n
		}
	}
	for _, m := range ended.FindAllStringSubmatch(text, -1) {
		if n, _ := strconv.Atoi(m[2]); n < first[m[1]] {
			t.Errorf("storm of %s started with %d lost and ended saying %d at the worst", m[1], first[m[1]], n)
		}
	}
}
