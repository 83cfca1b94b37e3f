package main

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestTypesAPIRefusals: a bad change of a type's thresholds is a 400 that
// says what to give, and changes nothing; a type that breaks the id rules
// is refused; a good one answers what is in force and where it comes from,
// GET /v1/types lists the configured and the set types, and DELETE goes
// back to the config file's.
func TestTypesAPIRefusals(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) {
		c.Thresholds.Types = map[string]time.Duration{"meter": time.Minute}
		c.Thresholds.ConfirmAfter = map[string]time.Duration{"valve": 10 * time.Second}
	})
	waitReady(t, app)
	for _, c := range []struct {
		path string
		body any
		want string
	}{
		{"/v1/types/meter", map[string]string{"threshold": "ten minutes"}, `threshold "ten minutes": give a Go duration`},
		{"/v1/types/meter", map[string]string{"threshold": "-5s"}, "from 1ms to"},
		{"/v1/types/meter", map[string]string{"threshold": "0s"}, "from 1ms to"},
		{"/v1/types/meter", map[string]string{"threshold": "9000h"}, "from 1ms to 8784h0m0s"},
		{"/v1/types/meter", map[string]string{"confirm_after": "-1s"}, `confirm_after "-1s": give a Go duration such as 30s, from 0s to`},
		{"/v1/types/meter", map[string]string{"confirm_after": "soon"}, `confirm_after "soon"`},
		{"/v1/types/meter", map[string]string{}, `body must be {"threshold": "10m", "confirm_after": "30s"}`},
		{"/v1/types/meter", map[string]string{"treshold": "10m"}, `unknown field "treshold"`},
		{"/v1/types/meter", map[string]int{"threshold": 600}, `field "threshold" cannot be a JSON number`},
		{"/v1/types/a%01b", map[string]string{"threshold": "10m"}, "device type has control characters"},
		{"/v1/types/" + strings.Repeat("x", 300), map[string]string{"threshold": "10m"}, "too long"},
	} {
		code, out := call(t, app, "PUT", c.path, "t0ken", c.body)
		if msg, _ := out["error"].(string); code != http.StatusBadRequest || !strings.Contains(msg, c.want) {
			t.Errorf("PUT %.40s %v: got %d %v, want 400 saying %q", c.path, c.body, code, out, c.want)
		}
	}
	if code, out := call(t, app, "GET", "/v1/types/meter", "t0ken", nil); code != http.StatusOK || out["threshold_from"] != "config" ||
		out["threshold_ms"] != float64(60_000) || out["confirm_after_from"] != "default" {
		t.Errorf("GET meter after the refusals: %d %v, want 1m from config, nothing changed", code, out)
	}

	out := putType(t, app, "meter", map[string]string{"confirm_after": "30s"})
	if out["threshold_from"] != "config" || out["confirm_after"] != "30s" || out["confirm_after_from"] != "runtime" {
		t.Errorf("PUT confirm_after alone: %v, want the threshold left to the config file", out)
	}
	out = putType(t, app, "meter", map[string]string{"threshold": "10m"})
	if out["threshold"] != "10m0s" || out["threshold_from"] != "runtime" || out["confirm_after_from"] != "runtime" {
		t.Errorf("PUT threshold alone: %v, want 10m set and the confirm_after kept", out)
	}
	code, list := call(t, app, "GET", "/v1/types", "t0ken", nil)
	types, _ := list["types"].([]any)
	if code != http.StatusOK || len(types) != 2 {
		t.Fatalf("GET /v1/types: %d %v, want meter and valve", code, list)
	}
	if m, _ := types[0].(map[string]any); m["type"] != "meter" || m["threshold_from"] != "runtime" {
		t.Errorf("GET /v1/types first row: %v, want meter set at run time", m)
	}
	if v, _ := types[1].(map[string]any); v["type"] != "valve" || v["confirm_after_from"] != "config" || v["threshold_from"] != "default" {
		t.Errorf("GET /v1/types second row: %v, want valve's confirm_after from config", v)
	}
	if code, out := call(t, app, "DELETE", "/v1/types/meter", "t0ken", nil); code != http.StatusOK ||
		out["threshold_from"] != "config" || out["confirm_after_from"] != "default" {
		t.Errorf("DELETE meter: %d %v, want back to the config file's", code, out)
	}
	if code, _ := call(t, app, "PUT", "/v1/types/meter", "", map[string]string{"threshold": "1m"}); code != http.StatusUnauthorized {
		t.Errorf("PUT without the token: %d, want 401", code)
	}

	var stdout, stderr bytes.Buffer
	if code := run([]string{"type", "set", "meter", "--api", "http://" + app.HTTPAddr()}, &stdout, &stderr); code == 0 ||
		!strings.Contains(stderr.String(), "give --threshold, --confirm-after or both") {
		t.Errorf("sigwatch type set without a value: exit %d, stderr %q; want a refusal saying what to give", code, stderr.String())
	}
}
