package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/internal/tlsconfig"
)

// These tests prove the "TLS and credentials" promise against real servers: Redis with
// requirepass on its TLS port, Mosquitto with a password file on a TLS listener, NATS with a user
// and TLS. sigwatch is configured only through its Config, as an operator would.

const (
	secUser     = "sigwatch"
	secPassword = "s3cret"
	secToken    = "t0ken"
)

func startSecureServers(t *testing.T) *testenv.Env {
	t.Helper()
	return testenv.New(t, testenv.Options{Mosquitto: true, NATS: true,
		Secure: &testenv.Credentials{User: secUser, Password: secPassword}})
}

// secureConfig points sigwatch at env's TLS ports with the right credentials, as an operator's
// YAML would.
func secureConfig(t *testing.T, env *testenv.Env) Config {
	tlsOn := tlsconfig.Config{Enabled: true, CAFile: env.Certs.CAFile}
	cfg := DefaultConfig()
	cfg.Redis.Addrs = []string{env.Redis.TLSAddr}
	cfg.Redis.Password = secPassword
	cfg.Redis.TLS = tlsOn
	cfg.NATS.URL = env.NATS.URL
	cfg.NATS.User, cfg.NATS.Password = secUser, secPassword
	cfg.NATS.TLS = tlsOn
	cfg.MQTT.Brokers = []string{env.Mosquitto.URL}
	cfg.MQTT.Username, cfg.MQTT.Password = secUser, secPassword
	cfg.MQTT.TLS = tlsOn
	cfg.MQTT.ClientID = "sigwatch-" + strings.ReplaceAll(t.Name(), "/", "-")
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.HTTP.Token = secToken
	cfg.Thresholds.Default = time.Second
	return cfg
}

// startSecureApp is startApp for a Config built by secureEnv.config; the app's log goes to the
// returned buffer, which is written to the test log on failure.
func startSecureApp(t *testing.T, cfg Config) (*App, *testenv.LogBuffer) {
	t.Helper()
	logs := &testenv.LogBuffer{}
	before := testenv.IgnoreCurrent()
	app, err := Start(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatalf("Start: %v\nlog:\n%s", err, logs)
	}
	t.Cleanup(func() {
		if err := app.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
		testenv.VerifyNone(t, before)
		if t.Failed() {
			t.Logf("sigwatch log:\n%s", logs)
		}
	})
	return app, logs
}

// startExpectingError runs Start with cfg and returns its error, failing the test if it started.
func startExpectingError(t *testing.T, cfg Config) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := testenv.IgnoreCurrent()
	app, err := Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil {
		app.Stop()
		t.Fatal("Start: got nil error")
	}
	testenv.VerifyNone(t, before) // a refused start leaves nothing running
	return err
}

func secureMQTTClient(t *testing.T, env *testenv.Env, id string) mqtt.Client {
	t.Helper()
	return testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID(id).
		SetUsername(secUser).SetPassword(secPassword).SetTLSConfig(env.ClientTLS).
		SetConnectTimeout(5*time.Second))
}

// TestSecureTLSAndCredentialsEndToEnd proves the whole pipeline over TLS with credentials: a
// device publishing to an ssl:// broker with a password is watched (Redis over TLS with
// requirepass, read back through the API) and, once silent, reported lost on NATS over TLS
// with a user and password.
func TestSecureTLSAndCredentialsEndToEnd(t *testing.T) {
	env := startSecureServers(t)
	app, _ := startSecureApp(t, secureConfig(t, env))

	testenv.WaitFor(t, 10*time.Second, "/readyz 200 over TLS with credentials", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})

	// The watcher connects over TLS with the user and password.
	lost := testenv.Record[dispatch.Lost](t, env.Conn(t), "sigwatch.lost.>")

	const id = "sec-1"
	dev := secureMQTTClient(t, env, "device-"+id)
	publish := func() {
		t.Helper()
		if tok := dev.Publish("devices/"+id+"/signal", 1, false, "{}"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("device publish: %v", tok.Error())
		}
	}
	publish()
	var view map[string]any
	testenv.WaitFor(t, 5*time.Second, "the device to be watched", func() bool {
		code, out := call(t, app, "GET", "/v1/devices/"+id, secToken, nil)
		view = out
		return code == http.StatusOK && out["watched"] == true
	})
	// A second signal is read through the same TLS session and pushes the deadline on.
	firstDeadline := int64(view["deadline"].(float64))
	time.Sleep(100 * time.Millisecond)
	publish()
	testenv.WaitFor(t, 5*time.Second, "the second signal to push the deadline", func() bool {
		_, out := call(t, app, "GET", "/v1/devices/"+id, secToken, nil)
		dl, _ := out["deadline"].(float64)
		return int64(dl) > firstDeadline
	})
	silentSince := time.Now()
	if code, _ := call(t, app, "GET", "/v1/devices/"+id, "", nil); code != http.StatusUnauthorized {
		t.Errorf("GET device without the token: %d, want 401", code)
	}

	m := lost.Wait(t, 8*time.Second, "a sigwatch.lost.* event within 8s of the device going silent", nil)
	if ev := m.Body; ev.Device != id || !strings.HasPrefix(m.Subject, "sigwatch.lost.") {
		t.Errorf("lost event %s %+v, want device %s", m.Subject, ev, id)
	}
	if ev := m.Body; ev.Deadline < silentSince.UnixMilli()+time.Second.Milliseconds()-100 {
		t.Errorf("lost event deadline %d is before the last signal + 1s (%d)", ev.Deadline, silentSince.UnixMilli()+1000)
	}
	// The scanner publishes before it records the loss (DESIGN: publish, then
	// compare-and-remove), so the API may lag the event by a moment.
	testenv.WaitFor(t, 3*time.Second, "the API to report the device lost", func() bool {
		code, out := call(t, app, "GET", "/v1/devices/"+id, secToken, nil)
		return code == http.StatusOK && out["lost"] == true
	})
}

// TestSecureWrongCredentials proves a wrong Redis or NATS credential, or a certificate sigwatch
// does not trust, stops Start with an error naming the service; and that a wrong MQTT password
// leaves the process running but not ready.
func TestSecureWrongCredentials(t *testing.T) {
	env := startSecureServers(t)

	startFails := []struct {
		name    string
		mutate  func(*Config)
		service string // what the error must start with
		cause   string // and contain
	}{
		{"redis password", func(c *Config) { c.Redis.Password = "nope" }, "redis", "WRONGPASS"},
		{"redis without password", func(c *Config) { c.Redis.Password = "" }, "redis", "NOAUTH"},
		{"redis untrusted certificate", func(c *Config) { c.Redis.TLS.CAFile = "" }, "redis", "certificate"},
		{"redis plain to TLS port", func(c *Config) { c.Redis.TLS.Enabled = false }, "redis", ""},
		{"nats password", func(c *Config) { c.NATS.Password = "nope" }, "nats", "Authorization Violation"},
		{"nats untrusted certificate", func(c *Config) { c.NATS.TLS.CAFile = "" }, "nats", "certificate"},
		{"nats missing ca file", func(c *Config) { c.NATS.TLS.CAFile = filepath.Join(t.TempDir(), "none.pem") }, "nats", "ca_file"},
	}
	for _, tc := range startFails {
		t.Run(tc.name, func(t *testing.T) {
			cfg := secureConfig(t, env)
			tc.mutate(&cfg)
			err := startExpectingError(t, cfg)
			t.Logf("Start: %v", err)
			if !strings.HasPrefix(err.Error(), tc.service) || !strings.Contains(err.Error(), tc.cause) {
				t.Errorf("Start: %v\nwant an error starting with %q and containing %q", err, tc.service, tc.cause)
			}
		})
	}

	// ingest connects to the broker in Run, not Start, and paho retries a refused CONNECT
	// every second for ever (SetConnectRetry): the process stays up, /healthz says ok,
	// but /readyz must say MQTT is not connected, and keep saying it.
	t.Run("mqtt password", func(t *testing.T) {
		cfg := secureConfig(t, env)
		cfg.MQTT.Password = "nope"
		app, logs := startSecureApp(t, cfg)
		// Watched for more than two connect attempts.
		testenv.Never(t, 2500*time.Millisecond, "/readyz other than 503 naming mqtt alone, with a wrong MQTT password", func() bool {
			code, out := call(t, app, "GET", "/readyz", "", nil)
			problems := fmt.Sprint(out["problems"])
			if code != http.StatusServiceUnavailable || !strings.Contains(problems, "mqtt: not connected") {
				t.Logf("/readyz: %d %v, want 503 naming mqtt", code, out)
				return true
			}
			if strings.Contains(problems, "redis") || strings.Contains(problems, "nats") {
				t.Logf("/readyz blames more than mqtt: %v", problems)
				return true
			}
			return false
		})
		if code, _ := call(t, app, "GET", "/healthz", "", nil); code != http.StatusOK {
			t.Errorf("/healthz: %d, want 200 (the process is alive, just not ready)", code)
		}
		select {
		case <-app.done:
			t.Fatalf("sigwatch stopped on a refused MQTT CONNECT: %v", app.Wait())
		default:
		}
		if got := testenv.Scraped(t, "http://"+app.HTTPAddr()+"/metrics", "sigwatch_ingest_connected"); got != 0 {
			t.Errorf("metric sigwatch_ingest_connected = %v, want 0", got)
		}
		t.Logf("sigwatch log while the broker refused its password:\n%s", logs)
	})
}
