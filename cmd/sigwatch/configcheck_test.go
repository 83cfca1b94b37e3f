package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
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

// TestHealthcheckCommand: `sigwatch healthcheck URL` exits 0 only on 200.
func TestHealthcheckCommand(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
	defer srv.Close()
	var out, errOut bytes.Buffer
	if code := run([]string{"healthcheck", srv.URL}, &out, &errOut); code != 0 {
		t.Errorf("200: exit %d, %s", code, errOut.String())
	}
	status = http.StatusServiceUnavailable
	if code := run([]string{"healthcheck", srv.URL}, &out, &errOut); code != 1 {
		t.Errorf("503: exit %d, want 1", code)
	}
}
