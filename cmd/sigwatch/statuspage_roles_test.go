package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestStatusPageWithAViewerToken drives the status page in headless
// Chromium with a viewer token: it shows the fleet and the open alarm,
// says whose read-only token it uses, and shows no ack or mute button; the
// operator who acked the alarm is named on it. With an operator token the
// buttons are there.
func TestStatusPageWithAViewerToken(t *testing.T) {
	b := newBrowser(t)
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	dir := t.TempDir()
	const viewer, operator = "grafana-0123456789abcdef", "oncall-0123456789abcdef"
	var tokens []api.TokenConfig
	for name, tok := range map[string]string{"grafana": viewer, "oncall": operator} {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		role := "viewer"
		if tok == operator {
			role = "operator"
		}
		tokens = append(tokens, api.TokenConfig{Name: name, Role: role, TokenFile: f})
	}
	app := startApp(t, env, func(c *Config) {
		c.Thresholds.Default = time.Second
		c.Storm.Enabled = false
		c.HTTP.Tokens = tokens
	})
	base := "http://" + app.HTTPAddr()
	shots := screenshotDir(t)
	for _, id := range []string{"pump-8", "pump-9"} {
		if code, _ := call(t, app, "POST", "/v1/signals", operator, []map[string]any{{"device": id}}); code != http.StatusOK {
			t.Fatalf("signal: %d", code)
		}
	}
	testenv.WaitFor(t, 20*time.Second, "both alarms raised", func() bool {
		_, res := call(t, app, "GET", "/v1/alarms", viewer, nil)
		al, _ := res["alarms"].([]any)
		return len(al) == 2
	})
	if code, res := call(t, app, "POST", "/v1/devices/pump-9/ack", operator, map[string]any{"for": "1h"}); code != http.StatusOK {
		t.Fatalf("ack as the operator: %d %v", code, res)
	}

	b.open(t, base, viewer, shots, "viewer-failed")
	testenv.WaitFor(t, 20*time.Second, "the alarms on the page", func() bool {
		return b.hasRow(t, "alarms", "pump-8") && b.hasRow(t, "alarms", "pump-9")
	})
	var who string
	b.eval(t, `document.getElementById('who').textContent`, &who)
	if who != "grafana · viewer (read only)" {
		t.Errorf("the page says it uses %q, want grafana · viewer (read only)", who)
	}
	var shown int
	b.eval(t, `[...document.querySelectorAll('#alarms button.ack, #alarms button.mute')].filter(b => b.offsetParent !== null).length`, &shown)
	if shown != 0 {
		t.Errorf("a viewer sees %d ack or mute buttons, want none", shown)
	}
	var inputs int
	b.eval(t, `[...document.querySelectorAll('#ack-for, #mute-for')].filter(e => e.offsetParent !== null).length`, &inputs)
	if inputs != 0 {
		t.Errorf("a viewer sees %d ack or mute fields, want none", inputs)
	}
	var row string
	b.eval(t, rowJS("alarms", "pump-9")+`.textContent`, &row)
	if !strings.Contains(row, "by oncall") {
		t.Errorf("the acked alarm's row %q does not name who acked it (oncall)", row)
	}
	b.shot(t, shots, "viewer")

	// Without a token until the next log-in, the page's calls are refused.
	b.loginAt.Store(0)
	b.run(t, chromedp.Click("#forget", chromedp.ByID), chromedp.WaitVisible("#login", chromedp.ByID))
	b.logIn(t, operator)
	testenv.WaitFor(t, 20*time.Second, "the operator's buttons", func() bool {
		b.eval(t, `[...document.querySelectorAll('#alarms button.ack, #alarms button.mute')].filter(b => b.offsetParent !== null).length`, &shown)
		return shown == 4
	})
	b.eval(t, `document.getElementById('who').textContent`, &who)
	if who != "oncall · operator" {
		t.Errorf("the page says it uses %q, want oncall · operator", who)
	}
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %v", errs)
	}
}
