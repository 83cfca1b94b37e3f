package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/minversion"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// oldNATSServer is the nats-server older than 2.10 that `make test-deps`
// installs (Debian's package); the test skips where there is none.
func oldNATSServer(t *testing.T) (bin, version string) {
	t.Helper()
	bin, err := servers.LookPath("nats-server")
	if err != nil {
		t.Skip("no nats-server binary older than 2.10 (make test-deps installs Debian's 2.9): ", err)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	// "nats-server: v2.9.10"
	version = strings.TrimPrefix(strings.TrimSpace(string(out[strings.LastIndex(string(out), " ")+1:])), "v")
	if newer, ok := minversion.AtLeast(version, "2.10"); !ok || newer {
		t.Skipf("%s is nats-server %s, not one older than 2.10 (make test-deps installs Debian's 2.9)", bin, version)
	}
	return bin, version
}

// TestRunRefusesOldNATSServer starts a real nats-server older than 2.10
// with JetStream and sees `sigwatch run` refuse it at start, in one line
// naming the version found, the version needed and how to get one, before
// it says it started.
func TestRunRefusesOldNATSServer(t *testing.T) {
	bin, version := oldNATSServer(t)
	env := testenv.New(t, testenv.Options{Mosquitto: true})
	dir := t.TempDir()
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ns := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(dir, "js"))
	ns.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(filepath.Join(dir, "nats.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	ns.Stdout, ns.Stderr = logf, logf
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Process.Kill(); _ = ns.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	testenv.WaitFor(t, 10*time.Second, "the old nats-server listening", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	url := "nats://" + addr
	cmd := exec.Command(binary, "run")
	cmd.Env = append(os.Environ(), "SIGWATCH_REDIS_ADDRS="+env.Redis.Addr, "SIGWATCH_NATS_URL="+url,
		"SIGWATCH_MQTT_BROKERS="+env.Mosquitto.URL, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-old-nats", "SIGWATCH_HTTP_ADDR=127.0.0.1:0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("sigwatch run kept running against nats-server %s:\n%s", version, out)
	}
	if err == nil {
		t.Fatalf("sigwatch run exited 0 against nats-server %s:\n%s", version, out)
	}
	want := fmt.Sprintf("sigwatch: nats-server %s at %s: sigwatch needs 2.10 or newer with JetStream (go install github.com/nats-io/nats-server/v2@latest, or the release binaries", version, url)
	if !strings.Contains(string(out), want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	if strings.Contains(string(out), "sigwatch started") {
		t.Errorf("sigwatch said it started before refusing the server:\n%s", out)
	}
}
