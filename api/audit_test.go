package api

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// auditServer serves the audit trail's routes on a real Redis and NATS
// (JetStream), each call made by the caller who: a call to /ack/{id}
// answers 200, or 409 for id "nobody", as the alarm's ack does; the
// other routes are the API's own.
func auditServer(t *testing.T, env *testenv.Env, who Caller) (*API, *httptest.Server, *prometheus.Registry, *testenv.LogBuffer) {
	t.Helper()
	nc := env.Conn(t, nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	pub, err := dispatch.New(t.Context(), nc, dispatch.Options{AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	reg, logs := prometheus.NewRegistry(), &testenv.LogBuffer{}
	a := New(Options{Store: env.Store(t, "sw"), Pub: pub, Gatherer: reg, Registerer: reg, Now: time.Now,
		Log: slog.New(slog.NewTextHandler(logs, nil))})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /ack/{id}", a.audited("device.ack", pathTarget("id"), func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "nobody" {
			writeError(w, http.StatusConflict, "device nobody has no open alarm")
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"state": "idle"})
	}))
	mux.Handle("/", a.Handler())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(withCaller(r.Context(), who)))
	}))
	t.Cleanup(srv.Close)
	return a, srv, reg, logs
}

func send(t *testing.T, method, url string) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitAudit reads GET /v1/audit once it holds n records: they are kept
// just after the answers.
func waitAudit(t *testing.T, url string, n int) []AuditRecord {
	t.Helper()
	var got []AuditRecord
	testenv.WaitFor(t, 2*time.Second, fmt.Sprintf("%d audit records kept", n), func() bool {
		got = readAudit(t, url)
		return len(got) >= n
	})
	return got
}

func readAudit(t *testing.T, url string) []AuditRecord {
	t.Helper()
	resp, err := http.Get(url + "/v1/audit?limit=10")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l AuditList
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/audit: %d %v", resp.StatusCode, err)
	}
	return l.Records
}

// TestAuditRecordsTheCaller proves that a state-changing call is recorded
// once, with the name of the caller's token (never the token), its role,
// the action, the target and how it ended: logged, published on
// sigwatch.audit and read back from GET /v1/audit, newest first; a
// refused call with the refusal's words and status.
func TestAuditRecordsTheCaller(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	_, srv, reg, logs := auditServer(t, env, Caller{Name: "ops-alice", Role: RoleOperator})
	sub, err := env.Conn(t).SubscribeSync("sigwatch.audit")
	if err != nil {
		t.Fatal(err)
	}
	if code := send(t, "POST", srv.URL+"/ack/dev-1"); code != http.StatusOK {
		t.Fatalf("ack dev-1: %d", code)
	}
	if code := send(t, "POST", srv.URL+"/ack/nobody"); code != http.StatusConflict {
		t.Fatalf("ack nobody: %d", code)
	}
	// A real route of the API: mutes need alarms, which this API has not.
	if code := send(t, "DELETE", srv.URL+"/v1/mutes/m-1"); code != http.StatusServiceUnavailable {
		t.Fatalf("DELETE /v1/mutes/m-1: %d", code)
	}
	want := []AuditRecord{
		{Who: "ops-alice", Role: "operator", Action: "device.ack", Target: "dev-1", Outcome: "ok", Status: 200},
		{Who: "ops-alice", Role: "operator", Action: "device.ack", Target: "nobody", Outcome: "device nobody has no open alarm", Status: 409},
		{Who: "ops-alice", Role: "operator", Action: "mute.delete", Target: "m-1", Outcome: "alarms need nats.mode jetstream", Status: 503},
	}
	same := func(got, want AuditRecord) bool {
		return got.ID != "" && got.At > 0 && got.Who == want.Who && got.Role == want.Role && got.Action == want.Action &&
			got.Target == want.Target && got.Outcome == want.Outcome && got.Status == want.Status
	}
	for j, w := range want {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("record %d on sigwatch.audit: %v", j, err)
		}
		var got AuditRecord
		if err := json.Unmarshal(m.Data, &got); err != nil || !same(got, w) {
			t.Errorf("sigwatch.audit record %d: %s, want %+v", j, m.Data, w)
		}
		if id := m.Header.Get(nats.MsgIdHdr); id != got.ID {
			t.Errorf("record %s carries Nats-Msg-Id %q, want its id", got.ID, id)
		}
	}
	if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("one more record than calls: %s", m.Data)
	}
	got := waitAudit(t, srv.URL, len(want))
	if len(got) != len(want) {
		t.Fatalf("GET /v1/audit: %d records %+v, want %d (the read itself is not recorded)", len(got), got, len(want))
	}
	for j, w := range want {
		if g := got[len(want)-1-j]; !same(g, w) {
			t.Errorf("GET /v1/audit record %d: %+v, want %+v (newest first)", len(want)-1-j, g, w)
		}
	}
	for _, line := range []string{`msg=audit who=ops-alice role=operator action=device.ack target=dev-1 outcome=ok status=200`,
		`msg=audit who=ops-alice role=operator action=device.ack target=nobody outcome="device nobody has no open alarm" status=409`} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("log has no line with %s:\n%s", line, logs.String())
		}
	}
	if n := testenv.Gathered(t, reg, "sigwatch_audit_records_total", "action", "device.ack", "outcome", "refused"); n != 1 {
		t.Errorf("sigwatch_audit_records_total{device.ack,refused} = %v, want 1", n)
	}
	if code := send(t, "GET", srv.URL+"/v1/audit?limit=1001"); code != http.StatusBadRequest {
		t.Errorf("GET /v1/audit?limit=1001: %d, want 400", code)
	}
}

// TestAuditWithNATSDown proves that a call made while NATS is down is
// answered as it would be, without waiting for NATS, and its record kept
// in Redis and in the log, its publish counted as failed.
func TestAuditWithNATSDown(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	_, srv, reg, logs := auditServer(t, env, Caller{Name: "ops-bob", Role: RoleAdmin})
	env.NATS.Shutdown()
	start := time.Now()
	if code := send(t, "POST", srv.URL+"/ack/dev-2"); code != http.StatusOK {
		t.Fatalf("ack dev-2 with NATS down: %d, want 200", code)
	}
	if took := time.Since(start); took > auditWait {
		t.Errorf("ack with NATS down took %v, want the answer without waiting for NATS (%v)", took, auditWait)
	}
	got := waitAudit(t, srv.URL, 1)
	if len(got) != 1 || got[0].Who != "ops-bob" || got[0].Role != "admin" || got[0].Action != "device.ack" || got[0].Target != "dev-2" || got[0].Outcome != "ok" {
		t.Errorf("GET /v1/audit with NATS down: %+v, want the ack by ops-bob", got)
	}
	if !strings.Contains(logs.String(), "msg=audit who=ops-bob role=admin action=device.ack target=dev-2 outcome=ok") {
		t.Errorf("the ack is not logged:\n%s", logs.String())
	}
	testenv.WaitFor(t, 2*time.Second, "the publish counted as failed", func() bool {
		return testenv.Gathered(t, reg, "sigwatch_audit_publish_failures_total") == 1
	})
}
