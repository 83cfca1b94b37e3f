package main

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestAuditTrail acks an alarm, creates and deletes a mute, removes the
// device and acks a device without an alarm through a running sigwatch:
// each call is one record on sigwatch.audit and in GET /v1/audit (and
// sigwatch audit), with the caller's name ("local" without tokens), the
// action, the target and the outcome, the refused ack with its refusal;
// the alarm shows who acked it.
func TestAuditTrail(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) {
		c.HTTP.Token = ""
		c.Thresholds.Default = 300 * time.Millisecond
		c.Storm.Enabled = false
	})
	sub, err := env.Conn(t).SubscribeSync("sigwatch.audit")
	if err != nil {
		t.Fatal(err)
	}
	if code, out := call(t, app, "POST", "/v1/signals", "", []map[string]any{{"device": "dev-a", "type": "meter"}}); code != http.StatusOK {
		t.Fatalf("POST /v1/signals: %d %v", code, out)
	}
	testenv.WaitFor(t, 10*time.Second, "the alarm of dev-a raised", func() bool {
		code, out := call(t, app, "GET", "/v1/devices/dev-a", "", nil)
		al, _ := out["alarm"].(map[string]any)
		return code == http.StatusOK && al != nil && al["state"] == "raised"
	})
	if code, out := call(t, app, "POST", "/v1/devices/dev-a/ack", "", map[string]string{"for": "1h"}); code != http.StatusOK || out["acked_by"] != "local" {
		t.Fatalf("ack dev-a: %d %v, want acked_by local", code, out)
	}
	var alarms api.AlarmList
	appJSON(t, app, "/v1/alarms", &alarms)
	if len(alarms.Alarms) != 1 || alarms.Alarms[0].AckedBy != "local" {
		t.Errorf("GET /v1/alarms: %+v, want dev-a acked by local", alarms.Alarms)
	}
	if _, out := call(t, app, "GET", "/v1/devices/dev-a", "", nil); out["alarm"].(map[string]any)["acked_by"] != "local" {
		t.Errorf("GET /v1/devices/dev-a: alarm %v, want acked_by local", out["alarm"])
	}
	if code, out := call(t, app, "POST", "/v1/devices/ghost/ack", "", nil); code != http.StatusConflict {
		t.Errorf("ack ghost: %d %v, want 409", code, out)
	}
	code, mute := call(t, app, "POST", "/v1/mutes", "", map[string]string{"device": "dev-a", "for": "1h"})
	muteID, _ := mute["id"].(string)
	if code != http.StatusCreated || muteID == "" {
		t.Fatalf("POST /v1/mutes: %d %v", code, mute)
	}
	if code, out := call(t, app, "DELETE", "/v1/mutes/"+muteID, "", nil); code != http.StatusOK {
		t.Fatalf("DELETE mute: %d %v", code, out)
	}
	if code, out := call(t, app, "DELETE", "/v1/devices/dev-a", "", nil); code != http.StatusOK {
		t.Fatalf("DELETE dev-a: %d %v", code, out)
	}

	want := []api.AuditRecord{
		{Action: "device.ack", Target: "dev-a", Outcome: "ok", Status: 200},
		{Action: "device.ack", Target: "ghost", Outcome: "device ghost has no open alarm", Status: 409},
		{Action: "mute.create", Target: muteID + " device dev-a", Outcome: "ok", Status: 201},
		{Action: "mute.delete", Target: muteID, Outcome: "ok", Status: 200},
		{Action: "device.remove", Target: "dev-a", Outcome: "ok", Status: 200},
	}
	same := func(got, want api.AuditRecord) bool {
		return got.ID != "" && got.At > 0 && got.Who == "local" && got.Role == "admin" && got.Action == want.Action &&
			got.Target == want.Target && got.Outcome == want.Outcome && got.Status == want.Status
	}
	for j, w := range want {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("record %d (%s) on sigwatch.audit: %v", j, w.Action, err)
		}
		var got api.AuditRecord
		if err := json.Unmarshal(m.Data, &got); err != nil || !same(got, w) {
			t.Errorf("sigwatch.audit record %d: %s, want who local, role admin, %+v", j, m.Data, w)
		}
		if id := m.Header.Get(nats.MsgIdHdr); id != got.ID {
			t.Errorf("record %s carries Nats-Msg-Id %q, want its id", got.ID, id)
		}
	}
	var l api.AuditList
	testenv.WaitFor(t, 2*time.Second, "every record in GET /v1/audit", func() bool {
		appJSON(t, app, "/v1/audit", &l)
		return len(l.Records) >= len(want)
	})
	if len(l.Records) != len(want) {
		t.Fatalf("GET /v1/audit: %d records %+v, want %d", len(l.Records), l.Records, len(want))
	}
	for j, w := range want {
		if g := l.Records[len(want)-1-j]; !same(g, w) {
			t.Errorf("GET /v1/audit record %d: %+v, want %+v (newest first)", len(want)-1-j, g, w)
		}
	}

	// The CLI lists the same records.
	out, err := exec.Command(binary, "audit", "--api", "http://"+app.HTTPAddr(), "--limit", "2", "--json").Output()
	var cl api.AuditList
	if err != nil || json.Unmarshal(out, &cl) != nil || len(cl.Records) != 2 || cl.Records[0].ID != l.Records[0].ID {
		t.Errorf("sigwatch audit --limit 2 --json: %v\n%s\nwant the two newest records", err, out)
	}
	out, err = exec.Command(binary, "audit", "--api", "http://"+app.HTTPAddr()).Output()
	if err != nil || !strings.Contains(string(out), "device.remove") || !strings.Contains(string(out), "device ghost has no open alarm") {
		t.Errorf("sigwatch audit: %v\n%s\nwant the removal and the refused ack", err, out)
	}
}

// appJSON decodes the JSON of GET path into v.
func appJSON(t *testing.T, app *App, path string, v any) {
	t.Helper()
	resp, err := http.Get("http://" + app.HTTPAddr() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
}

// TestAuditTrailWithNATSDown mutes a device while NATS is down: the call,
// which needs Redis alone, is answered as usual and at once, and its
// record is in GET /v1/audit; it is counted as not published.
func TestAuditTrailWithNATSDown(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) { c.HTTP.Token = "" })
	ready := func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	}
	testenv.WaitFor(t, 20*time.Second, "ready", ready)
	env.NATS.Shutdown()
	start := time.Now()
	code, mute := call(t, app, "POST", "/v1/mutes", "", map[string]string{"type": "meter", "for": "1h"})
	took := time.Since(start)
	if code != http.StatusCreated || took > 300*time.Millisecond {
		t.Fatalf("POST /v1/mutes with NATS down: %d %v after %v, want 201 within 300ms", code, mute, took)
	}
	t.Logf("POST /v1/mutes with NATS down answered in %v", took.Round(time.Millisecond))
	var l api.AuditList
	testenv.WaitFor(t, 2*time.Second, "the record in GET /v1/audit", func() bool {
		appJSON(t, app, "/v1/audit", &l)
		return len(l.Records) >= 1
	})
	if len(l.Records) != 1 || l.Records[0].Action != "mute.create" || l.Records[0].Outcome != "ok" || l.Records[0].Who != "local" ||
		l.Records[0].Target != mute["id"].(string)+" type meter" {
		t.Errorf("GET /v1/audit with NATS down: %+v, want the mute by local", l.Records)
	}
	testenv.WaitFor(t, 2*time.Second, "the publish counted as failed", func() bool {
		return testenv.Scraped(t, "http://"+app.HTTPAddr()+"/metrics", "sigwatch_audit_publish_failures_total") == 1
	})
	// Back to ready before the app stops, as a stop while NATS is down
	// reports the consumers that could not start.
	if err := env.NATS.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "ready again", ready)
}
