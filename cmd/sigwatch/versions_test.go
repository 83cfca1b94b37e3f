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

// oldNATSServer is a nats-server older than 2.10: Debian's package, which
// `make test-deps` installs (/usr/sbin or /usr/bin), or one on PATH. The
// test skips where there is none.
func oldNATSServer(t *testing.T) (bin, version string) {
	t.Helper()
	var seen []string
	for _, cand := range []string{"/usr/sbin/nats-server", "/usr/bin/nats-server", "nats-server"} {
		p, err := exec.LookPath(cand)
		if err != nil {
			continue
		}
		out, err := exec.Command(p, "--version").CombinedOutput()
		if err != nil {
			t.Fatalf("%s --version: %v\n%s", p, err, out)
		}
		// "nats-server: v2.9.10"
		f := strings.Fields(string(out))
		if len(f) == 0 {
			continue
		}
		v := strings.TrimPrefix(f[len(f)-1], "v")
		if newer, ok := minversion.AtLeast(v, "2.10"); ok && !newer {
			return p, v
		}
		seen = append(seen, p+" "+v)
	}
	t.Skipf("no nats-server older than 2.10 (found: %v); make test-deps installs Debian's 2.9", seen)
	return "", ""
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
