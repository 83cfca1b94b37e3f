package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// startApp runs sigwatch in-process against env with an API token. When the test ends the app
// stops, leaving no goroutine of its own behind.
func startApp(t *testing.T, env *testenv.Env, mutate func(*Config)) *App {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Redis.Addrs = []string{env.Redis.Addr}
	cfg.NATS.URL = env.NATS.URL
	cfg.MQTT.Brokers = []string{env.Mosquitto.URL}
	cfg.MQTT.ClientID = "sigwatch-api-test"
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.HTTP.Token = "t0ken"
	if mutate != nil {
		mutate(&cfg)
	}
	before := testenv.IgnoreCurrent()
	app, err := Start(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := app.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
		testenv.VerifyNone(t, before)
	})
	return app
}

func call(t *testing.T, app *App, method, path, token string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+app.HTTPAddr()+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

func TestAPI(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) { c.Thresholds.Default = time.Hour })
	const tok = "t0ken"

	if code, _ := call(t, app, "GET", "/v1/shards", "", nil); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/shards without token: %d, want 401", code)
	}
	if code, _ := call(t, app, "GET", "/healthz", "", nil); code != http.StatusOK {
		t.Errorf("GET /healthz: %d, want 200 without a token", code)
	}
	testenv.WaitFor(t, 10*time.Second, "readyz", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})

	id := "meter/7.a*b" // slashes and NATS wildcards are fine in ids
	path := "/v1/devices/" + url.PathEscape(id)
	if code, _ := call(t, app, "GET", path, tok, nil); code != http.StatusNotFound {
		t.Errorf("GET unknown device: %d, want 404", code)
	}
	before := time.Now().UnixMilli()
	if code, out := call(t, app, "POST", "/v1/signals", tok, []map[string]any{{"device": id, "type": "meter"}}); code != http.StatusOK {
		t.Fatalf("POST /v1/signals: %d %v", code, out)
	}
	code, dev := call(t, app, "GET", path, tok, nil)
	if code != http.StatusOK || dev["watched"] != true || dev["type"] != "meter" {
		t.Fatalf("GET device: %d %v, want watched meter", code, dev)
	}
	if dl := int64(dev["deadline"].(float64)); dl < before+time.Hour.Milliseconds() {
		t.Errorf("deadline %d, want at least signal time + 1h (%d)", dl, before+time.Hour.Milliseconds())
	}

	// A lowered threshold applies at once, counted from the last signal.
	code, dev = call(t, app, "PUT", path+"/threshold", tok, map[string]string{"threshold": "1m"})
	if code != http.StatusOK || int64(dev["threshold_ms"].(float64)) != 60000 {
		t.Fatalf("PUT threshold: %d %v, want threshold_ms 60000", code, dev)
	}
	if dl := int64(dev["deadline"].(float64)); dl > time.Now().UnixMilli()+time.Minute.Milliseconds() {
		t.Errorf("deadline after lowering to 1m is %d, want within a minute", dl)
	}
	if code, _ := call(t, app, "PUT", path+"/threshold", tok, map[string]string{"threshold": "soon"}); code != http.StatusBadRequest {
		t.Errorf("PUT threshold soon: %d, want 400", code)
	}

	if code, out := call(t, app, "POST", "/v1/signals", tok, []map[string]any{{"device": strings.Repeat("x", 300)}}); code != http.StatusBadRequest {
		t.Errorf("POST huge id: %d %v, want 400", code, out)
	}
	code, sh := call(t, app, "GET", "/v1/shards", tok, nil)
	if code != http.StatusOK || sh["shards"].(float64) != 16 || sh["devices"].(float64) != 1 {
		t.Errorf("GET /v1/shards: %d shards=%v devices=%v, want 16 shards, 1 device", code, sh["shards"], sh["devices"])
	}
	if code, out := call(t, app, "DELETE", path, tok, nil); code != http.StatusOK || out["removed"] != true {
		t.Fatalf("DELETE device: %d %v", code, out)
	}
	if code, _ := call(t, app, "GET", path, tok, nil); code != http.StatusNotFound {
		t.Errorf("GET deleted device: %d, want 404", code)
	}
}

// The API refuses the ids MQTT refuses, by ingest's one rule: C0 and C1
// control characters, DEL and invalid UTF-8 never become devices over HTTP
// either.
func TestAPIRefusesIDsIngestRefuses(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, nil)
	const tok = "t0ken"

	for _, id := range []string{"a\u0085b", "a\u009bb", "a\x01b", "a\x7fb"} {
		if code, out := call(t, app, "POST", "/v1/signals", tok, []map[string]any{{"device": id}}); code != http.StatusBadRequest {
			t.Errorf("POST /v1/signals device %q: %d %v, want 400", id, code, out)
		}
	}
	for _, id := range []string{"a\u0085b", "a\u009bb", "a\x01b", "a\xffb"} {
		if code, out := call(t, app, "GET", "/v1/devices/"+url.PathEscape(id), tok, nil); code != http.StatusBadRequest {
			t.Errorf("GET /v1/devices/%q: %d %v, want 400", id, code, out)
		}
	}
	if code, sh := call(t, app, "GET", "/v1/shards", tok, nil); code != http.StatusOK || sh["devices"].(float64) != 0 {
		t.Errorf("GET /v1/shards after refused ids: %d devices=%v, want 0 devices", code, sh["devices"])
	}
	// Printable non-ASCII is a valid id.
	if code, out := call(t, app, "POST", "/v1/signals", tok, []map[string]any{{"device": "ünï"}}); code != http.StatusOK {
		t.Errorf("POST /v1/signals device ünï: %d %v, want 200", code, out)
	}
}
