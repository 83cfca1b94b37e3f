package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// chromiumPath finds the headless browser deploy/local/install.sh installs. Without it the test
// is skipped on a developer's machine and fails in CI, where it must run.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const mac = "/Applications/Chromium.app/Contents/MacOS/Chromium"
	if _, err := os.Stat(mac); err == nil {
		return mac
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium not found, and CI is set: the status page test must run in CI (make deps installs chromium)")
	}
	t.Skip("chromium not found: run `make deps` (deploy/local/install.sh) to install it")
	return ""
}

// browser drives one headless Chromium tab and collects the page's console
// errors and uncaught exceptions.
type browser struct {
	ctx  context.Context
	mu   sync.Mutex
	errs []string
	// loginAt is when the page showed its data after the token was
	// entered, unix ms (0: not yet).
	loginAt atomic.Int64
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.WindowSize(1360, 900),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to sandbox as root
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	b := &browser{ctx: ctx}
	chromedp.ListenTarget(ctx, func(ev any) {
		var msg string
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			msg = "exception: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				msg += " " + ev.ExceptionDetails.Exception.Description
			}
		case *runtime.EventConsoleAPICalled:
			if ev.Type != runtime.APITypeError {
				return
			}
			var parts []string
			for _, a := range ev.Args {
				parts = append(parts, string(a.Value))
			}
			msg = "console.error: " + strings.Join(parts, " ")
		case *log.EventEntryAdded:
			if ev.Entry.Level != log.LevelError {
				return
			}
			// The page learns that a token is needed from the API's 401:
			// the browser logs that on every poll until the token is
			// entered. The entry's own time tells, not when this listener
			// sees it or when the test started typing: on a loaded machine
			// both can come polls later.
			if ev.Entry.Source == log.SourceNetwork && strings.Contains(ev.Entry.Text, "401") && b.beforeLogin(ev.Entry.Timestamp) {
				return
			}
			msg = fmt.Sprintf("%s: %s %s", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL)
		default:
			return
		}
		b.mu.Lock()
		b.errs = append(b.errs, msg)
		b.mu.Unlock()
	})
	if err := chromedp.Run(ctx, log.Enable()); err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	return b
}

// beforeLogin reports whether the browser's time at was before the page
// logged in.
func (b *browser) beforeLogin(at *runtime.Timestamp) bool {
	login := b.loginAt.Load()
	return login == 0 || at != nil && at.Time().UnixMilli() < login
}

func (b *browser) run(t *testing.T, actions ...chromedp.Action) {
	t.Helper()
	// Generous: a loaded machine slows Chromium down several times.
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Run(ctx, actions...); err != nil {
		t.Fatalf("chromium: %v", err)
	}
}

// eval evaluates a JavaScript expression in the page into out.
func (b *browser) eval(t *testing.T, js string, out any) {
	t.Helper()
	b.run(t, chromedp.Evaluate(js, out))
}

func (b *browser) consoleErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errs...)
}

// shot writes a full-page PNG of the tab to dir/name.png.
func (b *browser) shot(t *testing.T, dir, name string) {
	t.Helper()
	var png []byte
	b.run(t, chromedp.FullScreenshot(&png, 100))
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", p)
}

// screenshotDir is where a test's screenshots go: SIGWATCH_SCREENSHOTS if
// set (made if missing), else the test's temporary directory.
func screenshotDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SIGWATCH_SCREENSHOTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// logIn enters the API token into the page's login form and waits for the
// page to show its data.
// open opens the status page at base, logs in with tok, and has a
// screenshot named failed taken into shots if the test fails.
func (b *browser) open(t *testing.T, base, tok, shots, failed string) {
	t.Helper()
	b.run(t, chromedp.Navigate(base+"/"), chromedp.WaitVisible("#login", chromedp.ByID))
	b.logIn(t, tok)
	t.Cleanup(func() {
		if t.Failed() {
			b.shot(t, shots, failed)
		}
	})
}

func (b *browser) logIn(t *testing.T, tok string) {
	t.Helper()
	b.run(t,
		chromedp.SendKeys("#token", tok, chromedp.ByID),
		chromedp.Click("#login button[type=submit]", chromedp.ByQuery),
		chromedp.WaitVisible("#main", chromedp.ByID),
	)
	b.loginAt.Store(time.Now().UnixMilli())
}

// rowJS is a JavaScript expression for the row of device id in table.
func rowJS(table, id string) string {
	q, _ := json.Marshal(id)
	return fmt.Sprintf(`[...document.querySelectorAll('#%s tbody tr')].find(tr => tr.dataset.device === %s)`, table, q)
}

func (b *browser) hasRow(t *testing.T, table, id string) bool {
	t.Helper()
	var ok bool
	b.eval(t, fmt.Sprintf(`!!(%s)`, rowJS(table, id)), &ok)
	return ok
}

// signalEvery posts the signals batch returns to POST /v1/signals at base
// every 250ms until the test ends.
func signalEvery(t *testing.T, base, tok string, batch func() []map[string]any) {
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			body, _ := json.Marshal(batch())
			req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/signals", strings.NewReader(string(body)))
			req.Header.Set("Authorization", "Bearer "+tok)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	t.Cleanup(func() { stop(); wg.Wait() })
}

// TestStatusPageInChromium drives the status page at / in headless Chromium
// against a running sigwatch with an API token and a small fleet that
// signals over HTTP. The page asks for the token and sends it; a silenced
// device shows in the lost table within seconds, its id shown as text
// (markup in an id stays text); the ack button acks its alarm and the mute
// button mutes another's, as the API then reports; the devices leave the
// lost table once they signal again; the page logs no console error; and
// when sigwatch stops answering the page says so and keeps its last data.
func TestStatusPageInChromium(t *testing.T) {
	b := newBrowser(t) // before the servers: skips early without chromium
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) {
		// Devices signal every 250ms. The two silenced are meters, lost
		// 1.5s after their last signal; the rest of the fleet are
		// trackers, which only a 30s stall of this test's process, far
		// beyond a loaded machine's, could lose.
		c.Thresholds.Default = 1500 * time.Millisecond
		c.Thresholds.Types = map[string]time.Duration{"meter": 1500 * time.Millisecond, "tracker": 30 * time.Second}
		c.Alarm.Interval = time.Second
		c.Alarm.MaxInterval = time.Second
	})
	const tok = "t0ken"
	base := "http://" + app.HTTPAddr()
	shots := screenshotDir(t)

	// The silenced device's id holds a slash, markup, quotes and URL
	// metacharacters: the page must show it as text and escape it in paths.
	silent := `meter/7 <b>"x"</b> & ü?#%`
	ids := []string{silent}
	for i := range 19 {
		ids = append(ids, fmt.Sprintf("dev-%02d", i))
	}
	// The device muted in step 2 is silenced with it.
	const other = "dev-03"
	var mu sync.Mutex
	quiet := map[string]bool{}
	// The fleet: every device not silenced signals every 250ms.
	signalEvery(t, base, tok, func() (batch []map[string]any) {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if !quiet[id] {
				typ := "tracker"
				if id == silent || id == other {
					typ = "meter"
				}
				batch = append(batch, map[string]any{"device": id, "type": typ})
			}
		}
		return batch
	})
	setQuiet := func(id string, q bool) {
		mu.Lock()
		quiet[id] = q
		mu.Unlock()
	}

	testenv.WaitFor(t, 20*time.Second, "readyz", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})
	testenv.WaitFor(t, 20*time.Second, "the fleet watched", func() bool {
		code, sh := call(t, app, "GET", "/v1/shards", tok, nil)
		return code == http.StatusOK && sh["devices"] == float64(len(ids))
	})

	// The page and its assets need no token; the API behind them does.
	for _, p := range []string{"/", "/ui/app.js", "/ui/style.css"} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s without a token: %d, want 200", p, resp.StatusCode)
		}
	}

	// 0. The page asks for the token, then shows the fleet.
	b.run(t, chromedp.Navigate(base+"/"), chromedp.WaitVisible("#login", chromedp.ByID))
	b.shot(t, shots, "0-token")
	b.logIn(t, tok)
	b.run(t, chromedp.WaitVisible(".shard", chromedp.ByQuery))
	t.Cleanup(func() {
		if t.Failed() {
			b.shot(t, shots, "failed")
		}
	})
	// The generic timers show beside the fleet: a counter, and per shard in
	// the shard's tooltip.
	for _, id := range []string{"a", "b", "c"} {
		if code, body := apiCall(t, "PUT", app.HTTPAddr(), "/v1/timers/orders/"+id, tok, map[string]any{"after": "1h"}); code != http.StatusOK {
			t.Fatalf("PUT timer %s: %d %s", id, code, body)
		}
	}
	testenv.WaitFor(t, 20*time.Second, "the timers counter at 3", func() bool {
		var v string
		b.eval(t, `([...document.querySelectorAll('#counters .counter')].find(c => c.firstChild.textContent === 'timers') || {lastChild: {textContent: ''}}).lastChild.textContent`, &v)
		return v == "3"
	})
	var tips string
	b.eval(t, `[...document.querySelectorAll('#shards .shard')].map(c => c.title).join('\n')`, &tips)
	if !strings.Contains(tips, " timers, fired by ") || strings.Contains(tips, "fired by none") {
		t.Errorf("shard tooltips %q, want each to say its timers and who fires them", tips)
	}
	var stored string
	b.eval(t, `sessionStorage.getItem('sigwatch.token')`, &stored)
	if stored != tok {
		t.Errorf("sessionStorage token %q, want %q", stored, tok)
	}

	// 1. A silenced device appears in the lost table within a few seconds.
	// A second one is silenced to be muted in step 2.
	setQuiet(silent, true)
	setQuiet(other, true)
	silencedAt := time.Now()
	testenv.WaitFor(t, 20*time.Second, "the silenced device in the lost table", func() bool {
		return b.hasRow(t, "lost", silent)
	})
	t.Logf("silenced device in the lost table after %v", time.Since(silencedAt).Round(time.Millisecond))
	var cell string
	b.eval(t, rowJS("lost", silent)+`.cells[0].textContent`, &cell)
	if cell != silent {
		t.Errorf("lost table shows id %q, want %q as text", cell, silent)
	}
	var injected bool
	b.eval(t, `document.querySelector('main b') !== null`, &injected)
	if injected {
		t.Error("markup in a device id became an element: the page put data into innerHTML")
	}
	// The other went silent at the same moment, but its deadline may fall
	// after the next refresh of the page.
	testenv.WaitFor(t, 20*time.Second, "the other silenced device in the lost table", func() bool {
		return b.hasRow(t, "lost", other)
	})
	var lostRows int
	b.eval(t, `document.querySelectorAll('#lost tbody tr').length`, &lostRows)
	if lostRows != 2 {
		t.Errorf("lost table has %d rows, want 2 (only %q and %s are silent)", lostRows, silent, other)
	}
	testenv.WaitFor(t, 20*time.Second, "their alarms in the open alarms table", func() bool {
		return b.hasRow(t, "alarms", silent) && b.hasRow(t, "alarms", other)
	})
	b.shot(t, shots, "1-lost")

	// 2. Its ack button acks the alarm for 10 minutes: the API says so.
	var row int
	b.eval(t, fmt.Sprintf(`[...document.querySelectorAll('#alarms tbody tr')].indexOf(%s)`, rowJS("alarms", silent)), &row)
	b.run(t,
		chromedp.SetValue("#ack-for", "10m", chromedp.ByID),
		chromedp.Click(fmt.Sprintf("#alarms tbody tr:nth-child(%d) button.ack", row+1), chromedp.ByQuery),
	)
	ackedAt := time.Now()
	path := "/v1/devices/" + url.PathEscape(silent)
	testenv.WaitFor(t, 15*time.Second, "the alarm acked through the API", func() bool {
		code, dev := call(t, app, "GET", path, tok, nil)
		al, _ := dev["alarm"].(map[string]any)
		return code == http.StatusOK && al != nil && al["state"] == "acked"
	})
	_, dev := call(t, app, "GET", path, tok, nil)
	al := dev["alarm"].(map[string]any)
	if u, _ := al["acked_until"].(float64); time.UnixMilli(int64(u)).Before(ackedAt.Add(9*time.Minute)) || time.UnixMilli(int64(u)).After(ackedAt.Add(11*time.Minute)) {
		t.Errorf("acked_until %v, want about 10m after the click (%v)", time.UnixMilli(int64(u)), ackedAt)
	}
	testenv.WaitFor(t, 15*time.Second, "the page showing the alarm acked", func() bool {
		var st string
		b.eval(t, `(`+rowJS("alarms", silent)+`||{cells:[0,0,{textContent:''}]}).cells[2].textContent`, &st)
		return strings.HasPrefix(st, "acked")
	})
	var msg string
	b.eval(t, `document.getElementById('action-msg').textContent`, &msg)
	if !strings.Contains(msg, "acked") {
		t.Errorf("action message %q, want it to say acked", msg)
	}

	// Its neighbour's mute button mutes that device for the time given.
	b.eval(t, fmt.Sprintf(`[...document.querySelectorAll('#alarms tbody tr')].indexOf(%s)`, rowJS("alarms", other)), &row)
	b.run(t,
		chromedp.SetValue("#mute-for", "30m", chromedp.ByID),
		chromedp.Click(fmt.Sprintf("#alarms tbody tr:nth-child(%d) button.mute", row+1), chromedp.ByQuery),
	)
	mutedAt := time.Now()
	testenv.WaitFor(t, 15*time.Second, "the mute through the API", func() bool {
		req, _ := http.NewRequest("GET", base+"/v1/mutes", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var ms []struct {
			Device string `json:"device"`
			Until  int64  `json:"until"`
		}
		if json.NewDecoder(resp.Body).Decode(&ms) != nil {
			return false
		}
		for _, m := range ms {
			u := time.UnixMilli(m.Until)
			if m.Device == other && u.After(mutedAt.Add(29*time.Minute)) && u.Before(mutedAt.Add(31*time.Minute)) {
				return true
			}
		}
		return false
	})
	testenv.WaitFor(t, 15*time.Second, "the page showing the alarm muted", func() bool {
		var st string
		b.eval(t, `(`+rowJS("alarms", other)+`||{cells:[0,0,{textContent:''}]}).cells[2].textContent`, &st)
		return strings.Contains(st, "muted")
	})
	b.shot(t, shots, "2-acked")

	// 3. The device signals again: it leaves the lost table.
	setQuiet(silent, false)
	setQuiet(other, false)
	revivedAt := time.Now()
	testenv.WaitFor(t, 20*time.Second, "the recovered device gone from the lost table", func() bool {
		return !b.hasRow(t, "lost", silent)
	})
	t.Logf("recovered device gone from the lost table after %v", time.Since(revivedAt).Round(time.Millisecond))
	testenv.WaitFor(t, 20*time.Second, "the lost table empty", func() bool {
		var empty bool
		b.eval(t, `!document.getElementById('lost-empty').hidden`, &empty)
		return empty
	})
	b.shot(t, shots, "3-recovered")

	var banner string
	b.eval(t, `document.getElementById('banner').hidden ? '' : document.getElementById('banner').textContent`, &banner)
	if banner != "" {
		t.Errorf("error banner shown: %q", banner)
	}
	for _, e := range b.consoleErrors() {
		t.Errorf("browser console: %s", e)
	}

	// 4. sigwatch goes away: the page says so in its banner and keeps the
	// last data it had, rather than going blank.
	if err := app.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	testenv.WaitFor(t, 20*time.Second, "the banner saying sigwatch is not answering", func() bool {
		b.eval(t, `document.getElementById('banner').hidden ? '' : document.getElementById('banner').textContent`, &banner)
		return strings.Contains(banner, "not answering")
	})
	var shards int
	b.eval(t, `document.querySelectorAll('.shard').length`, &shards)
	if shards != 16 {
		t.Errorf("after sigwatch stopped the page shows %d shards, want the last 16 it read", shards)
	}
	b.shot(t, shots, "4-down")
}

// TestDemoShowsStatusPage runs `sigwatch demo` as a user would, opens the
// status page URL it prints, with no token (the demo sets none), and waits
// for the fleet it simulates to show: counters, lost devices, the shard map.
func TestDemoShowsStatusPage(t *testing.T) {
	b := newBrowser(t)
	shots := screenshotDir(t)
	cmd := exec.Command(binary, "demo", "--ports", "free", "--dir", t.TempDir(), "--duration", "40s", "--devices", "300", "--threshold", "1s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	page := make(chan string, 1)
	go func() { // reads the demo's output to its end, so the demo never blocks on it
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "status" {
				select {
				case page <- f[1]:
				default:
				}
			}
		}
	}()
	var u string
	select {
	case u = <-page:
	case <-time.After(30 * time.Second):
		t.Fatal("sigwatch demo printed no status page URL (a line `status  http://...`) within 30s")
	}
	if !strings.HasPrefix(u, "http://127.0.0.1:") || !strings.HasSuffix(u, "/") {
		t.Fatalf("status page URL %q, want http://127.0.0.1:<port>/", u)
	}
	b.run(t, chromedp.Navigate(u), chromedp.WaitVisible(".shard", chromedp.ByQuery))
	testenv.WaitFor(t, 20*time.Second, "lost devices and signals/s on the demo's page", func() bool {
		var ok bool
		b.eval(t, `document.querySelectorAll('#lost tbody tr').length > 0 &&
			[...document.querySelectorAll('#counters .counter')].some(c => c.firstChild.textContent === 'signals/s' && c.lastChild.textContent !== '0' && c.lastChild.textContent !== '–')`, &ok)
		return ok
	})
	// A few seconds more fill the fire-lag chart.
	testenv.WaitFor(t, 15*time.Second, "the fire-lag chart drawn", func() bool {
		var ok bool
		b.eval(t, `document.querySelectorAll('#chart polyline').length > 0`, &ok)
		return ok
	})
	b.shot(t, shots, "demo")
	var login bool
	b.eval(t, `!document.getElementById('login').hidden`, &login)
	if login {
		t.Error("the demo's page asks for a token: the demo sets none")
	}
	for _, e := range b.consoleErrors() {
		t.Errorf("browser console: %s", e)
	}
}
