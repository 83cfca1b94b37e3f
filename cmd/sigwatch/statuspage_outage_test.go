package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestStatusPageShowsBrokerOutage drives the status page in headless
// Chromium through a broker restart: while Mosquitto is down the page says
// an outage is in progress because the MQTT broker is lost; once it is back,
// that devices are in their reconnect grace and when it ends; then the
// outage is listed with its grace. GET /v1/stats says the same.
func TestStatusPageShowsBrokerOutage(t *testing.T) {
	b := newBrowser(t)
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) {
		c.Thresholds.Default = 2 * time.Second
		c.Ingest.ReconnectGrace = 6 * time.Second
	})
	const tok = "t0ken"
	base := "http://" + app.HTTPAddr()
	shots := screenshotDir(t)
	signalEvery(t, base, tok, func() []map[string]any {
		return []map[string]any{{"device": "pump-1"}, {"device": "pump-2"}}
	})
	b.open(t, base, tok, shots, "outage-failed")
	outages := func() string {
		var text string
		b.eval(t, `[...document.querySelectorAll('#counters .counter')].filter(d => d.firstChild.textContent === 'outages').map(d => d.className + ': ' + d.lastChild.textContent).join('')`, &text)
		return text
	}
	testenv.WaitFor(t, 10*time.Second, "the outages counter", func() bool { return outages() != "" })

	if err := env.Mosquitto.Kill(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "an outage in progress on the page", func() bool {
		return strings.Contains(outages(), "bad: in progress: MQTT broker lost")
	})
	b.shot(t, shots, "outage-broker-lost")
	code, st := call(t, app, "GET", "/v1/stats", tok, nil)
	if wm, _ := st["watermark"].(map[string]any); code != http.StatusOK || wm["outage"] != true || wm["broker_down"] == nil {
		t.Errorf("GET /v1/stats while the broker is down: %d %v, want an outage with broker_down", code, st["watermark"])
	}
	if err := env.Mosquitto.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 15*time.Second, "the reconnect grace on the page", func() bool {
		return strings.Contains(outages(), "reconnect grace after a broker restart, ends in")
	})
	b.shot(t, shots, "outage-grace")
	testenv.WaitFor(t, 15*time.Second, "the outage listed with its grace", func() bool {
		o := outages()
		return strings.Contains(o, "1, last ended") && strings.Contains(o, "of it reconnect grace")
	})
	b.shot(t, shots, "outage-after")
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %v", errs)
	}
}
