package main

import (
	"fmt"
	"net/http"
	"slices"
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
	b.eval(t, `[...document.querySelectorAll('#alarms tbody tr')].map(tr => tr.cells[0].textContent + ' ' + (tr.cells[2] ? tr.cells[2].textContent : ''))`, &rows)
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

// TestStatusPageNumbersAgreeInBigStorms drives the status page in headless
// Chromium while 10,000 of 10,240 devices are lost in four gateway storms
// (and the fleet's): the header's counts are GET /v1/stats's, held alarms
// among them; the open alarms table folds the 10,000 held alarms into one
// row per storm (a handful of rows, no per-device buttons) and lists a
// fold's alarms when opened; each storm row shows its group's lost devices
// now, not at its start; and a legend says what held means.
func TestStatusPageNumbersAgreeInBigStorms(t *testing.T) {
	b := newBrowser(t)
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) {
		c.Thresholds.Default = 2 * time.Second
		c.Alarm.Interval = 10 * time.Minute
		// Longer than the alarm workers take to count 10,000 losses into
		// the storms: no device alarm is raised before its storm starts.
		c.Storm.Hold = 20 * time.Second
	})
	const tok = "t0ken"
	base := "http://" + app.HTTPAddr()
	shots := screenshotDir(t)

	const dark, perGateway, alive = 4, 2500, 240
	var darkBatch, aliveBatch []map[string]any
	for g := range dark {
		for k := range perGateway {
			darkBatch = append(darkBatch, map[string]any{"device": fmt.Sprintf("gw%d-%04d", g, k), "type": "meter", "group": fmt.Sprintf("gw-%d", g)})
		}
	}
	for k := range alive {
		aliveBatch = append(aliveBatch, map[string]any{"device": fmt.Sprintf("gw%d-%04d", dark, k), "type": "meter", "group": fmt.Sprintf("gw-%d", dark)})
	}
	// One bulk post of the dark gateways' devices, their only signal; the
	// live gateway keeps signalling.
	if code, body := call(t, app, "POST", "/v1/signals", tok, darkBatch); code != http.StatusOK && code != http.StatusAccepted {
		t.Fatalf("POST /v1/signals: %d %v", code, body)
	}
	signalEvery(t, base, tok, func() []map[string]any { return aliveBatch })
	const lostWant, fleet = dark * perGateway, dark*perGateway + alive

	stats := func() map[string]any {
		code, v := call(t, app, "GET", "/v1/stats", tok, nil)
		if code != http.StatusOK {
			t.Fatalf("GET /v1/stats: %d %v", code, v)
		}
		return v
	}
	alarmsOf := func(v map[string]any) map[string]any { m, _ := v["alarms"].(map[string]any); return m }
	var seen string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last stats: %s", seen)
		}
	})
	testenv.WaitFor(t, 50*time.Second, "10,000 lost, their alarms held", func() bool {
		v := stats()
		seen = fmt.Sprintf("lost %v, alarms %v, at %v", v["lost"], alarmsOf(v), time.Now().Format("15:04:05.000"))
		return v["lost"] == float64(lostWant) && alarmsOf(v)["held"] == float64(lostWant) && alarmsOf(v)["active"] == float64(dark+1)
	})

	b.open(t, base, tok, shots, "big-storms-failed")
	// The header shows what GET /v1/stats says: the page and the test read
	// the same cached computation, or a later one equal to it (the fleet
	// stands still).
	var header map[string]string
	read := `Object.fromEntries([...document.querySelectorAll('#counters [data-value]')].map(e => [e.dataset.key, e.dataset.value]))`
	testenv.WaitFor(t, 10*time.Second, "the header's counts equal GET /v1/stats's", func() bool {
		b.eval(t, read, &header)
		v := stats()
		want := map[string]string{"watched": fmt.Sprint(v["watched"]), "lost": fmt.Sprint(v["lost"])}
		for k, n := range alarmsOf(v) {
			want[k] = fmt.Sprint(n)
		}
		return fmt.Sprint(header) == fmt.Sprint(want)
	})
	if header["lost"] != fmt.Sprint(lostWant) || header["held"] != fmt.Sprint(lostWant) || header["active"] != fmt.Sprint(dark+1) {
		t.Errorf("header %v, want %d lost, %d held, %d active", header, lostWant, lostWant, dark+1)
	}
	var note string
	b.eval(t, `document.getElementById('counters-note').hidden ? '' : document.getElementById('counters-note').textContent`, &note)
	if !strings.Contains(note, "LOST counts devices, ALARMS counts alarms") || !strings.Contains(note, "10,000") {
		t.Errorf("header note %q, want LOST and ALARMS explained with the 10,000 held", note)
	}

	// Storm rows: the live count of each group, and of the fleet.
	testenv.WaitFor(t, 10*time.Second, "storm rows with live counts", func() bool {
		var rows []string
		b.eval(t, `[...document.querySelectorAll('#storms tbody tr')].map(tr => tr.cells[0].textContent + '|' + tr.cells[1].textContent + '|' + tr.cells[2].textContent + '|' + tr.cells[3].textContent)`, &rows)
		want := map[string]bool{fmt.Sprintf("fleet|active|10,000 / %s|0 (others under their group’s)", num(fleet)): false}
		for g := range dark {
			want[fmt.Sprintf("group gw-%d|active|2,500 / 2,500|2,500", g)] = false
		}
		for _, r := range rows {
			if _, ok := want[r]; ok {
				want[r] = true
			}
		}
		for _, seen := range want {
			if !seen {
				return false
			}
		}
		return len(rows) == dark+1
	})

	// Open alarms: the storm alarms and one fold per storm.
	var rows []string
	b.eval(t, `[...document.querySelectorAll('#alarms tbody tr')].map(tr => tr.textContent)`, &rows)
	if len(rows) != 2*dark+1 {
		t.Errorf("open alarms table has %d rows, want %d (5 storm alarms, 4 folds): %q", len(rows), 2*dark+1, rows)
	}
	var buttons int
	b.eval(t, `document.querySelectorAll('#alarms tbody button[data-action]').length`, &buttons)
	if buttons != dark+1 {
		t.Errorf("%d ack/mute buttons in the open alarms, want %d (one ack per storm alarm)", buttons, dark+1)
	}
	if !slices.ContainsFunc(rows, func(r string) bool {
		return strings.Contains(r, "2,500 device alarms held under the storm of group gw-2")
	}) {
		t.Errorf("no fold of gw-2's held alarms among %q", rows)
	}
	var legend bool
	b.eval(t, `!document.getElementById('held-legend').hidden && document.getElementById('held-legend').textContent.includes('storm hold')`, &legend)
	if !legend {
		t.Error("no legend of held under the open alarms")
	}
	b.shot(t, shots, "big-storms")

	// Opening a fold lists a page of its alarms, with their buttons.
	b.run(t, chromedp.Click(`#alarms tbody button[data-fold="group:gw-2"]`, chromedp.ByQuery))
	testenv.WaitFor(t, 10*time.Second, "gw-2's held alarms listed", func() bool {
		var n int
		b.eval(t, `[...document.querySelectorAll('#alarms tbody tr.folded')].filter(tr => tr.dataset.device && tr.dataset.device.startsWith('gw2-') && tr.textContent.includes('held')).length`, &n)
		return n == 50
	})
	b.shot(t, shots, "big-storms-open")
	b.run(t, chromedp.Click(`#alarms tbody button[data-fold="group:gw-2"]`, chromedp.ByQuery))
	testenv.WaitFor(t, 10*time.Second, "the fold closed again", func() bool {
		var n int
		b.eval(t, `document.querySelectorAll('#alarms tbody tr').length`, &n)
		return n == 2*dark+1
	})
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %v", errs)
	}
}

// num formats n as the page does in an en-US browser (1,234).
func num(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
