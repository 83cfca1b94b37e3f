package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/internal/webhooks"
	"github.com/sigwatch/sigwatch/sinks"
)

// TestStatusPageShowsSinks drives the status page in headless Chromium
// with two webhook sinks, one taking the alarms and one answering 503: the
// sinks section lists both, the first ok with its last delivery, the
// second retrying with its error.
func TestStatusPageShowsSinks(t *testing.T) {
	b := newBrowser(t)
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	sec := webhooks.NewSecret()
	good, down := testenv.NewWebhookReceiver(t, sec), testenv.NewWebhookReceiver(t, sec)
	down.Answer(http.StatusServiceUnavailable, 0)
	t.Setenv("SINK_GOOD_URL", good.URL()+"/hook")
	t.Setenv("SINK_DOWN_URL", down.URL()+"/hook")
	t.Setenv("SINK_SECRET", sec.Reveal())
	app := startApp(t, env, func(c *Config) {
		c.Thresholds.Default = time.Second
		c.Storm.Enabled = false
		c.Sinks = []sinks.Config{
			{Name: "erp", Type: sinks.TypeWebhook, URLEnv: "SINK_GOOD_URL", SecretsEnv: []string{"SINK_SECRET"}},
			{Name: "ticketing", Type: sinks.TypeWebhook, URLEnv: "SINK_DOWN_URL", SecretsEnv: []string{"SINK_SECRET"}},
		}
	})
	const tok = "t0ken"
	base := "http://" + app.HTTPAddr()
	shots := screenshotDir(t)
	if code, _ := call(t, app, "POST", "/v1/signals", tok, []map[string]any{{"device": "pump-7"}}); code != http.StatusOK {
		t.Fatalf("signal: %d", code)
	}
	testenv.WaitFor(t, 20*time.Second, "the alarm at the good sink", func() bool { return len(good.Deliveries()) > 0 })

	b.open(t, base, tok, shots, "sinks-failed")
	testenv.WaitFor(t, 20*time.Second, "both sinks on the page, one retrying", func() bool {
		var text string
		b.eval(t, `document.getElementById('sinks-section').hidden ? '' : document.querySelector('#sinks tbody').textContent`, &text)
		return strings.Contains(text, "erp") && strings.Contains(text, "ticketing") && strings.Contains(text, "retrying") && strings.Contains(text, "503")
	})
	var rows []string
	b.eval(t, `[...document.querySelectorAll('#sinks tbody tr')].map(tr => [...tr.cells].map(c => c.textContent).join('|'))`, &rows)
	if len(rows) != 2 || !strings.HasPrefix(rows[0], "erp|webhook|ok|") || !strings.Contains(rows[0], "ago") ||
		!strings.HasPrefix(rows[1], "ticketing|webhook|retrying|") {
		t.Errorf("sink rows %q; want erp ok with its last delivery, ticketing retrying", rows)
	}
	b.shot(t, shots, "sinks")
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %v", errs)
	}

	// A test notification, through the API and the CLI: marked, sent at
	// once, the sink's answer reported.
	code, res := call(t, app, "POST", "/v1/sinks/erp/test", tok, nil)
	if code != http.StatusOK || res["ok"] != true {
		t.Fatalf("POST /v1/sinks/erp/test: %d %v", code, res)
	}
	id, _ := res["id"].(string)
	testenv.WaitFor(t, 5*time.Second, "the test notification at the sink", func() bool { return good.Count(id) == 1 })
	for _, d := range good.Deliveries() {
		if d.ID == id && !strings.Contains(string(d.Body), `"test":true`) {
			t.Errorf("test notification body %s: not marked as a test", d.Body)
		}
	}
	if code, res := call(t, app, "POST", "/v1/sinks/ticketing/test", tok, nil); code != http.StatusOK || res["ok"] != false ||
		!strings.Contains(fmt.Sprint(res["error"]), "503") {
		t.Errorf("a test through the failing sink: %d %v; want ok false with the 503", code, res)
	}
	if code, _ := call(t, app, "POST", "/v1/sinks/nope/test", tok, nil); code != http.StatusNotFound {
		t.Errorf("a test through an unknown sink: %d, want 404", code)
	}
	out, err := runCLI(t, app.HTTPAddr(), "sink", "test", "erp", "--token", tok)
	if err != nil || !strings.Contains(out, "sink erp took the test notification") {
		t.Errorf("sigwatch sink test erp: %v\n%s", err, out)
	}
	out, err = runCLI(t, app.HTTPAddr(), "sink", "ls", "--token", tok)
	if err != nil || !strings.Contains(out, "ticketing") || !strings.Contains(out, "retrying") {
		t.Errorf("sigwatch sink ls: %v\n%s", err, out)
	}
}
