package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// postSignals posts body to /v1/signals and returns the status, the reply
// and how long the request took.
func postSignals(t *testing.T, app *App, body []byte) (int, string, time.Duration) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+app.HTTPAddr()+"/v1/signals", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer t0ken")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), time.Since(start)
}

// signalBody is a POST /v1/signals body for devices prefix0000 …
func signalBody(prefix string, n int) []byte {
	sigs := make([]api.Signal, n)
	for j := range sigs {
		sigs[j] = api.Signal{Device: fmt.Sprintf("%s%05d", prefix, j)}
	}
	b, _ := json.Marshal(sigs)
	return b
}

// waitReady waits until the app's ingest is connected and its watermark
// moves, so that the scanners fire.
func waitReady(t *testing.T, app *App) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "readyz", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})
}

// waitWatched waits until the API says every one of ids is watched.
func waitWatched(t *testing.T, app *App, ids []string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "every device watched", func() bool {
		for _, id := range ids {
			if code, dev := call(t, app, "GET", "/v1/devices/"+id, "t0ken", nil); code != http.StatusOK || dev["watched"] != true {
				return false
			}
		}
		return true
	})
}

// TestSignalsTwoLargeBodiesNoEarly proves invariants 1 and 8 for the HTTP
// path: two 1,000-device bodies posted 3.5s apart with a 4s threshold fire
// nothing before the second body's deadlines (no watermark vouches for an
// entry of the second body before it is stored), and then each device is
// lost once.
func TestSignalsTwoLargeBodiesNoEarly(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const threshold = 4 * time.Second
	app := startApp(t, env, func(c *Config) { c.Thresholds.Default = threshold })
	waitReady(t, app)
	l := watchLost(t, env)

	body := signalBody("http-", 1000)
	first := time.Now()
	if code, out, took := postSignals(t, app, body); code != http.StatusOK {
		t.Fatalf("first post: %d %s, want 200", code, out)
	} else {
		t.Logf("first body of 1,000 stored in %v", took)
	}
	time.Sleep(time.Until(first.Add(3500 * time.Millisecond)))
	second := time.Now()
	code, out, took := postSignals(t, app, body)
	if code != http.StatusOK {
		t.Fatalf("second post: %d %s, want 200", code, out)
	}
	t.Logf("second body of 1,000 stored in %v", took)

	// Until the second body's deadlines, nothing may fire: watch that
	// whole window, then count.
	time.Sleep(time.Until(second.Add(threshold - 200*time.Millisecond)))
	if n := len(byDevice(l)); n > 0 {
		t.Fatalf("got %d of 1000 devices lost before the second body's deadlines, want 0 (first: %+v)", n, l.Bodies(nil)[0])
	}
	testenv.WaitFor(t, 15*time.Second, "every device lost after the second deadline", func() bool {
		return len(byDevice(l)) == 1000
	})
	for id, evs := range byDevice(l) {
		if len(evs) != 1 {
			t.Errorf("device %s lost %d times, want once", id, len(evs))
		}
		if ev := evs[0]; ev.Deadline < second.Add(threshold).UnixMilli() {
			t.Errorf("device %s lost on deadline %d, before its second signal's %d", id, ev.Deadline, second.Add(threshold).UnixMilli())
		}
	}
}

// TestSignalsTenThousandUnderASecond stores a 10,000-entry body as a batch:
// every device is watched once the reply says so, in under a second (the
// bound is checked without the race detector, which slows everything).
func TestSignalsTenThousandUnderASecond(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) { c.Thresholds.Default = time.Hour })
	waitReady(t, app)

	const n = 10000
	code, out, took := postSignals(t, app, signalBody("bulk-", n))
	if code != http.StatusOK || !strings.Contains(out, `"stored":10000`) {
		t.Fatalf("post of %d: %d %s, want 200 with stored 10000", n, code, out)
	}
	t.Logf("a body of %d entries stored in %v (race detector: %v)", n, took, raceEnabled)
	if !raceEnabled && took >= time.Second {
		t.Errorf("a body of %d entries took %v, want under 1s", n, took)
	}
	// Stored means watched: every entry is in Redis when the reply comes.
	var watched int
	for _, j := range []int{0, 1, n / 2, n - 1} {
		code, dev := call(t, app, "GET", fmt.Sprintf("/v1/devices/bulk-%05d", j), "t0ken", nil)
		if code == http.StatusOK && dev["watched"] == true {
			watched++
		}
	}
	if watched != 4 {
		t.Errorf("got %d of 4 sampled devices watched after the reply, want 4", watched)
	}
	// Again, now that they are known: the steady state.
	_, _, took = postSignals(t, app, signalBody("bulk-", n))
	t.Logf("the same body again in %v", took)
}

// TestSignalsRefusals: a body with one bad entry stores nothing and names
// the entry; a body over the entry limit is refused with 413.
func TestSignalsRefusals(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) { c.Thresholds.Default = time.Hour })
	waitReady(t, app)

	bad := []byte(`[{"device":"ok-1"},{"device":"a\u0001b"},{"device":"ok-2"}]`)
	code, out, _ := postSignals(t, app, bad)
	if code != http.StatusBadRequest || !strings.Contains(out, "signal 1") || !strings.Contains(out, "nothing was stored") {
		t.Errorf("body with a bad entry: got %d %s, want 400 naming signal 1 and saying nothing was stored", code, out)
	}
	if code, _ := call(t, app, "GET", "/v1/devices/ok-1", "t0ken", nil); code != http.StatusNotFound {
		t.Errorf("GET ok-1 after a refused body: %d, want 404 (nothing stored)", code)
	}
	code, out, _ = postSignals(t, app, []byte(`[{"device":"ok-1","ts":-5}]`))
	if code != http.StatusBadRequest || !strings.Contains(out, "signal 0") {
		t.Errorf("negative ts: got %d %s, want 400 naming signal 0", code, out)
	}
	code, out, _ = postSignals(t, app, signalBody("many-", api.MaxSignalsPerPost+1))
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(out, fmt.Sprint(api.MaxSignalsPerPost)) {
		t.Errorf("body over the entry limit: got %d %s, want 413 naming the limit", code, out)
	}
}

// TestThresholdFlipNoLost proves invariant 1 for threshold changes: devices
// signalling every 100ms over MQTT while two loops per device flip its
// threshold between 1s and 3s are never lost.
func TestThresholdFlipNoLost(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) { c.Thresholds.Default = 2 * time.Second })
	waitReady(t, app)
	l := watchLost(t, env)
	d := startDevices(t, env.Mosquitto.URL, 20, 100*time.Millisecond)
	waitWatched(t, app, d.ids)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	var flips, failed int
	var mu sync.Mutex
	// Two writers per device, as an operator and an automation might be:
	// their changes of one device interleave.
	for _, id := range append(append([]string(nil), d.ids...), d.ids...) {
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				thr := []string{"1s", "3s"}[k%2]
				code, _ := call(t, app, "PUT", "/v1/devices/"+id+"/threshold", "t0ken", map[string]string{"threshold": thr})
				mu.Lock()
				flips++
				if code != http.StatusOK {
					failed++
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	// The flips run for 10s; then every lost event is counted.
	time.Sleep(10 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d threshold flips, %d refused", flips, failed)
	if failed > 0 {
		t.Errorf("got %d refused threshold writes, want 0", failed)
	}
	if n := l.Len(); n > 0 {
		t.Errorf("got %d lost events for devices signalling every 100ms, want 0 (first: %+v)", n, l.Bodies(nil)[0])
	}
}

// TestThresholdAndDeleteDuringDoubling changes thresholds and removes
// devices while `sigwatch shards double` runs beside the API (whose
// topology lags it by up to its poll interval): devices that keep
// signalling are never lost, and removed devices are neither watched nor
// lost afterwards.
func TestThresholdAndDeleteDuringDoubling(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) { c.Thresholds.Default = 2 * time.Second })
	waitReady(t, app)
	l := watchLost(t, env)
	d := startDevices(t, env.Mosquitto.URL, 40, 100*time.Millisecond)
	flipped, removed := d.ids[:20], d.ids[20:]
	waitWatched(t, app, d.ids)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mu sync.Mutex
	var failed int
	for _, id := range append(append([]string(nil), flipped...), flipped...) {
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				code, _ := call(t, app, "PUT", "/v1/devices/"+id+"/threshold", "t0ken", map[string]string{"threshold": []string{"1s", "3s"}[k%2]})
				if code != http.StatusOK {
					mu.Lock()
					failed++
					mu.Unlock()
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	// The removed devices fall silent first, so that no signal of theirs is
	// still on its way when they are removed; their long threshold keeps
	// them from being lost meanwhile, however long the doubling takes.
	for _, id := range removed {
		if code, out := call(t, app, "PUT", "/v1/devices/"+id+"/threshold", "t0ken", map[string]string{"threshold": "1h"}); code != http.StatusOK {
			t.Fatalf("PUT threshold of %s: %d %v", id, code, out)
		}
		d.silence(id)
	}
	time.Sleep(500 * time.Millisecond)
	if out := cli(t, env, "shards", "double"); !strings.Contains(out, "16 -> 32") {
		t.Fatalf("shards double said %q, want 16 -> 32", out)
	}
	for _, id := range removed {
		if code, out := call(t, app, "DELETE", "/v1/devices/"+id, "t0ken", nil); code != http.StatusOK || out["removed"] != true {
			t.Errorf("DELETE %s during the doubling: %d %v, want 200 removed", id, code, out)
		}
	}
	// Longer than the longest threshold: a copy left behind would fire.
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()
	if failed > 0 {
		t.Errorf("got %d refused threshold writes during the doubling, want 0", failed)
	}
	if n := l.Len(); n > 0 {
		t.Errorf("got %d lost events (first: %+v), want 0: live devices and removed ones are never lost", n, l.Bodies(nil)[0])
	}
	store := env.Store(t, "sw")
	for _, id := range removed {
		if code, dev := call(t, app, "GET", "/v1/devices/"+id, "t0ken", nil); code != http.StatusNotFound {
			t.Errorf("GET removed %s: %d %v, want 404", id, code, dev)
		}
		for _, i := range []int{shard.Of(id, 16), shard.Of(id, 32)} {
			if dl, ok, err := store.Score(t.Context(), shard.Deadlines, i, id); err != nil || ok {
				t.Errorf("removed %s still in shard %d at %d (err %v), want no copy left", id, i, dl, err)
			}
		}
	}
}
