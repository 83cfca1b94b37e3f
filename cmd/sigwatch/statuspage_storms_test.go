package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestStatusPageShowsStorms drives the status page in headless Chromium
// while a gateway's devices go dark: the storms section appears with the
// group's storm going on, the open alarms show the group's alarm (and no
// alarm of its devices), and the storm's ack button acks the group alarm,
// as GET /v1/storms then reports.
func TestStatusPageShowsStorms(t *testing.T) {
	b := newBrowser(t)
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) {
		c.Thresholds.Default = 1500 * time.Millisecond
		c.Alarm.Interval = time.Minute
		c.Storm.Hold = 2 * time.Second
	})
	const tok = "t0ken"
	base := "http://" + app.HTTPAddr()
	shots := screenshotDir(t)

	type dev struct{ id, group string }
	var devs []dev
	for g := range 6 { // one gateway is a sixth of the fleet: no fleet storm
		for k := range 10 {
			devs = append(devs, dev{fmt.Sprintf("gw%d-s%02d", g, k), fmt.Sprintf("gw-%d", g)})
		}
	}
	var mu sync.Mutex
	dark := map[string]bool{}
	// The fleet signals every 250ms over HTTP, with its groups.
	signalEvery(t, base, tok, func() (batch []map[string]any) {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range devs {
			if !dark[d.group] {
				batch = append(batch, map[string]any{"device": d.id, "type": "sensor", "group": d.group})
			}
		}
		return batch
	})
	testenv.WaitFor(t, 10*time.Second, "the fleet watched", func() bool {
		code, sh := call(t, app, "GET", "/v1/shards", tok, nil)
		return code == http.StatusOK && sh["devices"] == float64(len(devs))
	})

	b.open(t, base, tok, shots, "storms-failed")
	var hidden bool
	b.eval(t, `document.getElementById('storms-section').hidden`, &hidden)
	if !hidden {
		t.Error("the storms section shows before any storm")
	}

	mu.Lock()
	dark["gw-1"] = true
	mu.Unlock()
	testenv.WaitFor(t, 15*time.Second, "the gw-1 storm on the page", func() bool {
		var text string
		b.eval(t, `document.getElementById('storms-section').hidden ? '' : document.querySelector('#storms tbody').textContent`, &text)
		return strings.Contains(text, "group gw-1") && strings.Contains(text, "active")
	})
	testenv.WaitFor(t, 10*time.Second, "the gw-1 alarm among the open alarms", func() bool {
		var text string
		b.eval(t, `document.querySelector('#alarms tbody').textContent`, &text)
		return strings.Contains(text, "group gw-1 (storm)")
	})
	time.Sleep(2500 * time.Millisecond) // past the hold
	var rows []string
	b.eval(t, `[...document.querySelectorAll('#alarms tbody tr')].map(tr => tr.cells[0].textContent + ' ' + tr.cells[2].textContent)`, &rows)
	for _, r := range rows {
		if strings.HasPrefix(r, "gw1-") && !strings.Contains(r, "held") {
			t.Errorf("open alarm row %q: a device of the dark gateway has an alarm of its own", r)
		}
	}
	b.shot(t, shots, "storm")

	b.run(t, chromedp.Click(`#storms tbody button`, chromedp.ByQuery))
	testenv.WaitFor(t, 10*time.Second, "the gw-1 alarm acked", func() bool {
		code, body := call(t, app, "GET", "/v1/storms", tok, nil)
		if code != http.StatusOK {
			return false
		}
		ss, _ := body["storms"].([]any)
		for _, s := range ss {
			m, _ := s.(map[string]any)
			al, _ := m["alarm"].(map[string]any)
			if m["group"] == "gw-1" && al["state"] == "idle" && strings.HasPrefix(fmt.Sprint(al["last"]), "resolved/acked") {
				return true
			}
		}
		return false
	})
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %v", errs)
	}
}
