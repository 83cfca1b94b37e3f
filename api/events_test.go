package api

import (
	"bufio"
	"context"
	"encoding/json"
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

// sse is one event read from GET /v1/events.
type sse struct{ id, name, data string }

// readEvents reads want events of u, or fails after a few seconds.
func readEvents(t *testing.T, u string, header http.Header, want int) []sse {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET %s: %d %s, want 200 text/event-stream", u, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var out []sse
	var cur sse
	sc := bufio.NewScanner(resp.Body)
	for len(out) < want && sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.data != "" {
				out = append(out, cur)
			}
			cur = sse{}
		case strings.HasPrefix(line, "id: "):
			cur.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			cur.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[6:]
		}
	}
	if len(out) < want {
		t.Fatalf("GET %s: %d events before the stream ended (%v), want %d: %v", u, len(out), sc.Err(), want, out)
	}
	return out
}

// TestEventsFilters proves GET /v1/events: the kinds and the device (read
// from the body) filter, last=N and since start earlier, Last-Event-ID
// resumes after an event read, fences never show, and bad queries are
// refused with 400 naming what is wrong.
func TestEventsFilters(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	nc := env.Conn(t, nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	pub, err := dispatch.New(t.Context(), nc, dispatch.Options{AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Options{Pub: pub, Gatherer: prometheus.NewRegistry(), Now: time.Now}).Handler())
	t.Cleanup(srv.Close)
	history := []struct{ subject, body string }{
		{"sigwatch.lost.pump", `{"id":"p1@1","device":"p1","type":"pump"}`},
		{"sigwatch.alarm.pump", `{"id":"a1","device":"p1","state":"raised"}`},
		{"sigwatch.storm", `{"id":"s1","scope":"fleet","state":"started"}`},
		{"sigwatch.fence.deadlines.0", `{"owner":"x","token":1}`},
		{"sigwatch.recovered.pump", `{"id":"p1@1/recovered","device":"p1","type":"pump"}`},
		{"sigwatch.lost.meter", `{"id":"m1@1","device":"m1","type":"meter"}`},
		{"sigwatch.system", `{"id":"y1","kind":"redis_restored"}`},
		{"sigwatch.timer.orders", `{"id":"orders/o1@1","queue":"orders","timer":"o1"}`},
	}
	for _, m := range history {
		if err := pub.Publish(t.Context(), []dispatch.Message{{Subject: m.subject, ID: m.subject, Body: []byte(m.body)}})[0]; err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "the history stored", func() bool { return len(readAll(t, srv.URL+"/v1/events?last=100")) == 7 })

	names := func(evs []sse) string {
		var s []string
		for _, e := range evs {
			s = append(s, e.name)
		}
		return strings.Join(s, ",")
	}
	for _, c := range []struct {
		query, want string
	}{
		{"last=100", "lost,alarm,storm,recovered,lost,system,timer"},
		{"last=2", "system,timer"},
		{"last=100&kind=lost", "lost,recovered,lost"},
		{"last=100&kind=alarms,storms", "alarm,storm"},
		{"last=100&kind=system&kind=timers", "system,timer"},
		{"last=100&device=p1", "lost,alarm,recovered"},
		{"last=1&kind=lost&device=p1", "recovered"},
		{"since=1m&kind=storms", "storm"},
	} {
		if got := names(readAll(t, srv.URL+"/v1/events?"+c.query)); got != c.want {
			t.Errorf("GET /v1/events?%s: got %s, want %s", c.query, got, c.want)
		}
	}
	all := readAll(t, srv.URL+"/v1/events?last=100")
	if !strings.Contains(all[0].data, `"device":"p1"`) {
		t.Errorf("first event's data %s, want the lost event's body", all[0].data)
	}
	// Resuming after the storm reads on from the recovered event.
	got := readEvents(t, srv.URL+"/v1/events", http.Header{"Last-Event-Id": {all[2].id}}, 1)
	if got[0].name != "recovered" {
		t.Errorf("Last-Event-ID %s: got %s first, want recovered", all[2].id, got[0].name)
	}
	// By default only new events come.
	done := make(chan []sse)
	go func() { done <- readEvents(t, srv.URL+"/v1/events?kind=lost&device=n1", nil, 1) }()
	time.Sleep(300 * time.Millisecond)
	for _, m := range []dispatch.Message{
		{Subject: "sigwatch.lost.pump", ID: "n0", Body: []byte(`{"id":"n0","device":"n0"}`)},
		{Subject: "sigwatch.lost.pump", ID: "n1", Body: []byte(`{"id":"n1","device":"n1"}`)},
	} {
		if err := pub.Publish(t.Context(), []dispatch.Message{m})[0]; err != nil {
			t.Fatal(err)
		}
	}
	if got := <-done; !strings.Contains(got[0].data, `"n1"`) {
		t.Errorf("new events of n1: got %v, want n1's lost", got)
	}

	for _, c := range []struct{ query, want string }{
		{"kind=lots", `unknown event kind "lots"`},
		{"since=10", `since "10"`},
		{"last=0", `last "0"`},
		{"last=1&since=1m", "not both"},
		{"after=x", `after (Last-Event-ID) "x"`},
	} {
		resp, err := http.Get(srv.URL + "/v1/events?" + c.query)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error string }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Error, c.want) {
			t.Errorf("GET /v1/events?%s: %d %q, want 400 naming %s", c.query, resp.StatusCode, e.Error, c.want)
		}
	}
}

// readAll reads the events of u already stored: up to the first keep-alive
// gap, which a test makes short by asking for history only.
func readAll(t *testing.T, u string) []sse {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 400*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", u, resp.StatusCode)
	}
	var out []sse
	var cur sse
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "" && cur.data != "":
			out = append(out, cur)
			cur = sse{}
		case strings.HasPrefix(line, "id: "):
			cur.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			cur.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[6:]
		}
	}
	return out
}
