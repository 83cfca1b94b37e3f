package main

import (
	"bytes"
	"context"
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

// pasted is a command line sigwatch printed, run as a user pasting it
// would in the repository, with no SIGWATCH_* variable set: bin/sigwatch is
// the binary under test.
func pasted(ctx context.Context, line string) *exec.Cmd {
	args := strings.Fields(line)
	if args[0] == "bin/sigwatch" {
		args[0] = binary
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = filepath.Join("..", "..")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SIGWATCH_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// TestDevReportsAPublishedDeviceLost runs `sigwatch dev` (make run) on free
// ports with a 1s threshold from the environment: it says where the
// broker, the API, NATS, the config (deploy/sigwatch.yaml, by its real
// path) and the logs are; its hints name the API off 8080 and the broker
// off 1883, so that the mosquitto_pub, events and device ls it prints work
// as pasted, and a handler's subscription is to a subject it would handle,
// not sigwatch.>; the device published so is reported lost; a quiet
// terminal is not filled with the same lines again, but once events were
// printed they come again after --remind; Ctrl-C stops everything with
// exit code 0.
func TestDevReportsAPublishedDeviceLost(t *testing.T) {
	dir := t.TempDir()
	out, interrupt := startInteractive(t, []string{"SIGWATCH_THRESHOLDS_DEFAULT=1s"},
		"dev", "--ports", "free", "--dir", dir, "--remind", "1s")
	broker := out.match(t, 60*time.Second, regexp.MustCompile(`\(broker (tcp://127\.0\.0\.1:\d+), topic devices/<id>/signal\)`))
	status := out.match(t, time.Second, regexp.MustCompile(`status +(http://127\.0\.0\.1:\d+/) `))
	api := strings.TrimSuffix(status, "/")
	pub := out.match(t, time.Second, regexp.MustCompile(`publish +(mosquitto_pub .*?) +\(broker`))
	events := out.match(t, time.Second, regexp.MustCompile(`events +(bin/sigwatch events.*?) +\(or your own`))
	lostLs := out.match(t, time.Second, regexp.MustCompile(`lost +(bin/sigwatch device ls .*)\n`))
	cfg, err := filepath.Abs(filepath.Join("..", "..", "deploy", "sigwatch.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"mosquitto_pub -p " + broker[strings.LastIndex(broker, ":")+1:] + " -t devices/pump-1/signal -m hi",
		"bin/sigwatch events --api " + api + " ", "bin/sigwatch device ls --state lost --api " + api + "\n",
		"nats sub -s nats://127.0.0.1:", " 'sigwatch.lost.>')",
		"config   " + cfg + " ", "silence threshold 1s", "logs     " + dir + " ",
		"export SIGWATCH_API=" + api, "export SIGWATCH_NATS_URL=nats://127.0.0.1:",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("sigwatch dev's output lacks %q", want)
		}
	}
	if strings.Contains(text, "'sigwatch.>'") {
		t.Errorf("sigwatch dev tells a handler to subscribe to sigwatch.>, internal subjects included")
	}
	resp, err := http.Get(status)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %s", status, resp.Status)
	}

	time.Sleep(2500 * time.Millisecond) // over two --remind with nothing to say
	if n := strings.Count(out.String(), "  publish  "); n != 1 {
		t.Errorf("a quiet sigwatch dev printed where everything is %d times, want once", n)
	}

	evCmd := pasted(t.Context(), events)
	evOut := &output{}
	evCmd.Stdout, evCmd.Stderr = evOut, evOut
	if err := evCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = evCmd.Process.Kill(); _ = evCmd.Wait() })
	time.Sleep(time.Second) // events follows from now on: let it connect
	if _, err := exec.LookPath("mosquitto_pub"); err == nil {
		if b, err := pasted(t.Context(), pub).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", pub, err, b)
		}
	} else {
		c := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(broker).SetClientID("dev-test-device"))
		if tok := c.Publish("devices/pump-1/signal", 1, false, "hi"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	out.match(t, 15*time.Second, regexp.MustCompile(`(lost +pump-1) `))
	evOut.match(t, 10*time.Second, regexp.MustCompile(`(lost +pump-1) `))
	if b, err := pasted(t.Context(), lostLs).CombinedOutput(); err != nil || !strings.Contains(string(b), "pump-1") {
		t.Errorf("%s: %v:\n%s\nwant pump-1 in it", lostLs, err, b)
	}
	testenv.WaitFor(t, 10*time.Second, "where everything is, printed again after an event", func() bool {
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
// reported lost, with reason silence; its Sparkplug B edge node dies and is
// reborn (demoEdgeNodeShown); a dark gateway's storm ends with the count it reached,
// never fewer than it started with, and the count still lost as it ended,
// the one `sigwatch events` shows; the alarms raised are one per silent
// device and one per dark gateway, fewer than the lost events, and the
// notifications are counted apart; Ctrl-C exits 0 and names the log dir.
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
	for _, want := range []string{"-t devices/pump-1/signal -m hi", "bin/sigwatch events --api " + status + " ", "nats sub -s nats://127.0.0.1:",
		" 'sigwatch.lost.>')", "bin/sigwatch device ls --state lost --api " + status + "\n",
		"config   " + cfg + " is what make run uses; the demo has settings of its own (silence threshold 1s)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}

	c := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(broker).SetClientID("demo-test-device"))
	if tok := c.Publish("devices/mine-1/signal", 1, false, "hi"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	out.match(t, 15*time.Second, regexp.MustCompile(`(your device mine-1: lost) \(silence; last signal \d\d:\d\d:\d\d\)`))
	demoEdgeNodeShown(t, out)
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
	ended := regexp.MustCompile(`storm ended: group (gw-\d+), (\d+) of its 50 devices lost at the worst, (\d+) still lost as it ended`)
	group := out.match(t, 30*time.Second, ended)
	stillLost := ended.FindStringSubmatch(out.String())[3]
	// `sigwatch events` says the same count at the storm's end.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	evb, _ := pasted(ctx, "bin/sigwatch events --storms --since 10m --api "+status).CombinedOutput()
	if want := "storm ended     group " + group + "  " + stillLost + " of 50 still lost"; !strings.Contains(string(evb), want) {
		t.Errorf("sigwatch events --storms printed:\n%s\nwant %q in it, as the demo said", evb, want)
	}
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
	perSecond := regexp.MustCompile(`lost +(\d+) +recovered +\d+ +alarms raised +(\d+) +storms +(\d+) `)
	lines := perSecond.FindAllStringSubmatch(text, -1)
	if len(lines) == 0 {
		t.Fatalf("no per-second line with lost, alarms raised and storms")
	}
	last := lines[len(lines)-1]
	if lost, raised := atoi(last[1]), atoi(last[2]); raised > lost {
		t.Errorf("per-second line %q: more alarms raised than lost events", last[0])
	}
	summary := regexp.MustCompile(`Alarms: (\d+) raised, (\d+) for single silent devices and (\d+) for dark gateways in (\d+) storms \(one alarm\s+for a gateway, not one per device\); (\d+) alarm notifications in all`)
	if m := summary.FindStringSubmatch(text); m == nil {
		t.Errorf("the summary does not say what the alarms were")
	} else if raised, single, gw, storms, msgs := atoi(m[1]), atoi(m[2]), atoi(m[3]), atoi(m[4]), atoi(m[5]); raised != single+gw || gw < 1 || gw > storms || msgs < raised {
		t.Errorf("summary %q: want raised = single + gateways, 1 <= gateway alarms <= storms, notifications >= raised", m[0])
	}
	if !regexp.MustCompile(`Edge node plant-1/edge-1: [1-9]\d* connection deaths, each an NDEATH declaring it and its 10 devices lost \(reason death\), and [1-9]\d* rebirths`).MatchString(text) {
		t.Errorf("the summary does not count the edge node's deaths and rebirths")
	}
	if !strings.Contains(text, "kept in "+logs) {
		t.Errorf("the demo did not name its log dir %s at the end", logs)
	}
	if _, err := os.Stat(filepath.Join(logs, "sigwatch.log")); err != nil {
		t.Errorf("the demo's log: %v", err)
	}
	// A storm ends with the most of its gateway lost at once, at least what
	// it started with: never "25 of 50" at the start and "24 of 50" at the end.
	// A gateway dark twice has two storms: each end goes with the start before it.
	storm := regexp.MustCompile(`storm (started|ended): group (gw-\d+), (\d+) of its 50 devices lost (?:so far|at the worst, (\d+) still lost)`)
	began := map[string]int{}
	for _, m := range storm.FindAllStringSubmatch(text, -1) {
		if m[1] == "started" {
			began[m[2]] = atoi(m[3])
			continue
		}
		if n := atoi(m[3]); n < began[m[2]] || n < atoi(m[4]) {
			t.Errorf("storm of %s started with %d lost and ended saying %d at the worst, %s at the end", m[2], began[m[2]], n, m[4])
		}
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
