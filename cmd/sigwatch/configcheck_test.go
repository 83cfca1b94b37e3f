package main

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestConfigCheck: `sigwatch config check` validates a file with the
// environment's overrides, as run would, and says what to change.
func TestConfigCheck(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"config", "check", "--config", "../../deploy/sigwatch.yaml"}, &out, &errOut); code != 0 {
		t.Fatalf("deploy/sigwatch.yaml: exit %d, %s", code, errOut.String())
	}
	// The compose config listens on every interface: no token, no start.
	t.Setenv("SIGWATCH_HTTP_TOKEN", "")
	errOut.Reset()
	if code := run([]string{"config", "check", "--config", "../../deploy/compose/sigwatch.yaml"}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "http.token") {
		t.Errorf("compose config without a token: exit %d, %q; want 1 naming http.token", code, errOut.String())
	}
	t.Setenv("SIGWATCH_HTTP_TOKEN", "s3cret")
	errOut.Reset()
	if code := run([]string{"config", "check", "--config", "../../deploy/compose/sigwatch.yaml"}, &out, &errOut); code != 0 {
		t.Errorf("compose config with a token: exit %d, %s", code, errOut.String())
	}
}

// TestConfigCheckWarnsOutageAfter: a threshold shorter than
// ingest.outage_after is accepted, and both `config check` and the start
// warn about it, naming the threshold and what to change; the shipped
// config draws no warning.
func TestConfigCheckWarnsOutageAfter(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"config", "check", "--config", "../../deploy/sigwatch.yaml"}, &out, &errOut); code != 0 || errOut.Len() != 0 {
		t.Fatalf("deploy/sigwatch.yaml: exit %d, %q; want 0 and no warning", code, errOut.String())
	}
	t.Setenv("SIGWATCH_THRESHOLDS_TYPES", "beacon=10s,tag=2s")
	errOut.Reset()
	code := run([]string{"config", "check", "--config", "../../deploy/sigwatch.yaml"}, &out, &errOut)
	if w := errOut.String(); code != 0 || !strings.Contains(w, "warning: ingest.outage_after (3s) is longer than thresholds.types.tag (2s)") ||
		!strings.Contains(w, "Set ingest.outage_after below 2s") {
		t.Errorf("a 2s type threshold: exit %d, %q; want 0 and a warning naming thresholds.types.tag and what to change", code, w)
	}
}

// TestConfigCheckWarnsShortDuplicates: a de-duplication window shorter
// than the alarm notifications' shortest fence (1s, taken at half the
// window) is accepted with a warning saying what to set.
func TestConfigCheckWarnsShortDuplicates(t *testing.T) {
	var out, errOut bytes.Buffer
	t.Setenv("SIGWATCH_NATS_DUPLICATES", "1s")
	code := run([]string{"config", "check", "--config", "../../deploy/sigwatch.yaml"}, &out, &errOut)
	if w := errOut.String(); code != 0 || !strings.Contains(w, "warning: nats.duplicates (1s) is below 2s") ||
		!strings.Contains(w, "Set nats.duplicates to 2s or more") {
		t.Errorf("nats.duplicates 1s: exit %d, %q; want 0 and a warning saying what to set", code, w)
	}
}

// TestHealthcheckCommand: `sigwatch healthcheck URL` exits 0 only on 200.
func TestHealthcheckCommand(t *testing.T) {
	var status atomic.Int32
	status.Store(http.StatusOK)
	url := statusServer(t, &status)
	var out, errOut bytes.Buffer
	if code := run([]string{"healthcheck", url}, &out, &errOut); code != 0 {
		t.Errorf("200: exit %d, %s", code, errOut.String())
	}
	status.Store(http.StatusServiceUnavailable)
	if code := run([]string{"healthcheck", url}, &out, &errOut); code != 1 {
		t.Errorf("503: exit %d, want 1", code)
	}
}

// statusServer answers every request with the status in status at the
// time, until the test ends. It writes its answers itself, so that this
// package names no handler.
func statusServer(t *testing.T, status *atomic.Int32) string {
	t.Helper()
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
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				resp := http.Response{StatusCode: int(status.Load()), ProtoMajor: 1, ProtoMinor: 1, Request: req}
				_ = resp.Write(c)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}
