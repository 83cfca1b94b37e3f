package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// listAPI pages through path (a list endpoint with its query) limit rows a
// page and returns the rows' field key, sorted, and every row by it.
func listAPI(t *testing.T, app *App, path, key string, limit int) ([]string, map[string]map[string]any) {
	t.Helper()
	rows := map[string]map[string]any{}
	var ids []string
	cursor := ""
	for page := 0; ; page++ {
		u := fmt.Sprintf("%s&limit=%d", path, limit)
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		code, out := call(t, app, "GET", u, "t0ken", nil)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %v", u, code, out)
		}
		list, _ := out[key].([]any)
		if out[key] == nil || len(list) > limit {
			t.Fatalf("GET %s: %d %s in %v, want a list of at most %d", u, len(list), key, out, limit)
		}
		for _, r := range list {
			row := r.(map[string]any)
			id := row["device"].(string)
			if _, dup := rows[id]; dup {
				t.Fatalf("GET %s: %s listed twice", path, id)
			}
			rows[id] = row
			ids = append(ids, id)
		}
		next, _ := out["next"].(string)
		if next == "" {
			slices.Sort(ids)
			return ids, rows
		}
		cursor = next
	}
}

// TestListsShowExactlyLostAndOpenAlarms runs a small fleet through the API
// with steady, silenced, recovered, acked and muted devices: state=lost
// lists exactly the silenced devices not back, and the alarm listing by
// each state exactly the alarms in it; the CLI shows the same.
func TestListsShowExactlyLostAndOpenAlarms(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) { c.Thresholds.Default = time.Second })
	const tok = "t0ken"
	testenv.WaitFor(t, 10*time.Second, "readyz", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})
	signal := func(ids ...string) {
		t.Helper()
		var body []map[string]any
		for _, id := range ids {
			body = append(body, map[string]any{"device": id, "type": strings.Split(id, "-")[0]})
		}
		if code, out := call(t, app, "POST", "/v1/signals", tok, body); code != http.StatusOK {
			t.Fatalf("POST /v1/signals: %d %v", code, out)
		}
	}
	steady := []string{"steady-0", "steady-1", "steady-2"}
	silent := []string{"silent-0", "silent-1", "silent-2", "silent-3", "silent-4", "silent-5"}
	back := []string{"back-0", "back-1"}
	signal(slices.Concat(steady, silent, back)...)
	ctx, stop := context.WithCancel(t.Context())
	keep := make(chan struct{})
	go func() {
		defer close(keep)
		for ctx.Err() == nil {
			signal(steady...)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	defer func() { stop(); <-keep }()

	lostNow := func() []string { ids, _ := listAPI(t, app, "/v1/devices?state=lost", "devices", 3); return ids }
	want := slices.Concat(back, silent)
	slices.Sort(want)
	testenv.WaitFor(t, 15*time.Second, "every silenced device lost", func() bool { return slices.Equal(lostNow(), want) })
	openNow := func(state string) []string {
		ids, _ := listAPI(t, app, "/v1/alarms?state="+state, "alarms", 2)
		return ids
	}
	// Raised once the storm hold has passed (held until then).
	testenv.WaitFor(t, 15*time.Second, "an alarm raised for every lost device", func() bool { return slices.Equal(openNow("active"), want) })

	signal(back...)
	if code, out := call(t, app, "POST", "/v1/devices/silent-0/ack", tok, map[string]string{"for": "1h"}); code != http.StatusOK {
		t.Fatalf("ack for 1h: %d %v", code, out)
	}
	if code, out := call(t, app, "POST", "/v1/devices/silent-1/ack", tok, nil); code != http.StatusOK {
		t.Fatalf("ack: %d %v", code, out)
	}
	code, mute := call(t, app, "POST", "/v1/mutes", tok, map[string]string{"device": "silent-2", "for": "1h"})
	if code != http.StatusOK && code != http.StatusCreated {
		t.Fatalf("mute: %d %v", code, mute)
	}
	testenv.WaitFor(t, 10*time.Second, "the recovered devices not lost", func() bool { return slices.Equal(lostNow(), silent) })
	testenv.WaitFor(t, 10*time.Second, "the recovered devices' alarms resolved", func() bool {
		return slices.Equal(openNow(""), []string{"silent-0", "silent-2", "silent-3", "silent-4", "silent-5"})
	})
	for state, want := range map[string][]string{
		"active":   {"silent-2", "silent-3", "silent-4", "silent-5"},
		"acked":    {"silent-0"},
		"muted":    {"silent-2"},
		"flapping": nil,
	} {
		if got := openNow(state); !slices.Equal(got, want) {
			t.Errorf("GET /v1/alarms?state=%s lists %v, want %v", state, got, want)
		}
	}
	_, rows := listAPI(t, app, "/v1/alarms?state=muted", "alarms", 10)
	if r := rows["silent-2"]; r["muted"] != true || r["mute"] != mute["id"] || r["type"] != "silent" || r["state"] != "active" {
		t.Errorf("muted row %v, want active, muted by %v, type silent", r, mute["id"])
	}
	_, rows = listAPI(t, app, "/v1/devices?state=lost", "devices", 10)
	if r := rows["silent-3"]; r["type"] != "silent" || r["state"] != "lost" || r["threshold_ms"] != float64(1000) ||
		r["lost_at"].(float64) < r["deadline"].(float64) || r["last_seen"] != r["deadline"].(float64)-1000 {
		t.Errorf("lost row %v, want type silent, lost at or after its deadline, seen a threshold before it", r)
	}
	ids, rows := listAPI(t, app, "/v1/devices?state=watched&type=steady", "devices", 10)
	if !slices.Equal(ids, steady) || rows["steady-0"]["deadline"].(float64) < float64(time.Now().UnixMilli()) {
		t.Errorf("watched steady devices %v (%v), want %v with deadlines ahead", ids, rows["steady-0"], steady)
	}
	everything := slices.Concat(steady, silent, back)
	slices.Sort(everything)
	if ids, _ := listAPI(t, app, "/v1/devices?", "devices", 4); !slices.Equal(ids, everything) {
		t.Errorf("every device: %v, want %v", ids, everything)
	}

	// The CLI, through the same API.
	var out bytes.Buffer
	base := []string{"--api", "http://" + app.HTTPAddr(), "--token", tok}
	if err := cmdDevice(t.Context(), append([]string{"ls", "--state", "lost", "--limit", "2", "--all", "--json"}, base...), &out); err != nil {
		t.Fatal(err)
	}
	var page api.DeviceList
	if err := json.Unmarshal(out.Bytes(), &page); err != nil || len(page.Devices) != len(silent) || page.Next != "" {
		t.Errorf("device ls --state lost --all --json: %v, %s", err, out.String())
	}
	out.Reset()
	if err := cmdAlarm(t.Context(), append([]string{"ls", "--state", "acked"}, base...), &out); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "DEVICE") ||
		!strings.HasPrefix(lines[1], "silent-0") {
		t.Errorf("alarm ls --state acked printed:\n%s\nwant a header and silent-0", out.String())
	}
	t.Logf("alarm ls --state acked:\n%s", out.String())
}

// TestListsRefuseBadQueries: limits out of range or malformed, unknown
// states and cursors not returned by a listing are refused with 400, and
// the lists need the token.
func TestListsRefuseBadQueries(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) { c.Thresholds.Default = time.Hour })
	for _, path := range []string{"/v1/devices", "/v1/alarms"} {
		if code, _ := call(t, app, "GET", path, "", nil); code != http.StatusUnauthorized {
			t.Errorf("GET %s without token: %d, want 401", path, code)
		}
		if code, out := call(t, app, "GET", path, "t0ken", nil); code != http.StatusOK {
			t.Errorf("GET %s: %d %v, want 200", path, code, out)
		}
		for _, q := range []string{"limit=0", "limit=1001", "limit=ten", "limit=-5", "state=gone",
			"cursor=%21%21", "cursor=eyJ2Ijo5OX0", "cursor=" + strings.Repeat("A", 40)} {
			code, out := call(t, app, "GET", path+"?"+q, "t0ken", nil)
			if msg, _ := out["error"].(string); code != http.StatusBadRequest || msg == "" {
				t.Errorf("GET %s?%s: %d %v, want 400 with a message", path, q, code, out)
			}
		}
	}
	// A cursor of the device listing is not one of the alarms'.
	call(t, app, "POST", "/v1/signals", "t0ken", []map[string]any{{"device": "a"}, {"device": "b"}})
	_, out := call(t, app, "GET", "/v1/devices?limit=1", "t0ken", nil)
	next, _ := out["next"].(string)
	if next == "" {
		t.Fatalf("GET /v1/devices?limit=1 over 2 devices: %v, want a next cursor", out)
	}
	if code, out := call(t, app, "GET", "/v1/alarms?cursor="+url.QueryEscape(next), "t0ken", nil); code != http.StatusBadRequest {
		t.Errorf("GET /v1/alarms with a device cursor: %d %v, want 400", code, out)
	}
}
