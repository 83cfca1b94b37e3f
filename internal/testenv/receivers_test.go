package testenv_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/internal/webhooks"
)

var plainClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// post sends body to url with header and returns the status, the body and the response headers.
func post(t *testing.T, url string, header http.Header, body string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := plainClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func TestPagerDutyReceiverKeepsTheEventsContract(t *testing.T) {
	pd := testenv.NewPagerDuty(t, testenv.PagerDutyOptions{})
	url := pd.EnqueueURL()
	trigger := `{"routing_key":"rk","event_action":"trigger","dedup_key":"device/d1","payload":{"summary":"d1 lost","source":"sigwatch","severity":"critical","custom_details":{"devices":["d1"]}}}`
	code, body, _ := post(t, url, nil, trigger)
	if code != http.StatusAccepted || !strings.Contains(body, `"dedup_key":"device/d1"`) || !strings.Contains(body, `"status":"success"`) {
		t.Fatalf("trigger: %d %s", code, body)
	}
	code, body, _ = post(t, url, nil, `{"routing_key":"rk","event_action":"trigger","payload":{"summary":"s","source":"x","severity":"info"}}`)
	var made struct {
		DedupKey string `json:"dedup_key"`
	}
	json.Unmarshal([]byte(body), &made)
	if code != http.StatusAccepted || made.DedupKey == "" {
		t.Fatalf("trigger without dedup_key: %d %s, want 202 with a key made up", code, body)
	}
	for _, action := range []string{"acknowledge", "resolve"} {
		if code, body, _ := post(t, url, nil, `{"routing_key":"rk","event_action":"`+action+`","dedup_key":"device/d1"}`); code != http.StatusAccepted {
			t.Fatalf("%s: %d %s", action, code, body)
		}
	}
	invalid := map[string]string{
		"not JSON":                  `{"routing_key":`,
		"no routing_key":            `{"event_action":"resolve","dedup_key":"k"}`,
		"bad action":                `{"routing_key":"rk","event_action":"page","dedup_key":"k"}`,
		"trigger without payload":   `{"routing_key":"rk","event_action":"trigger"}`,
		"trigger without summary":   `{"routing_key":"rk","event_action":"trigger","payload":{"source":"x","severity":"info"}}`,
		"trigger without source":    `{"routing_key":"rk","event_action":"trigger","payload":{"summary":"s","severity":"info"}}`,
		"trigger with bad severity": `{"routing_key":"rk","event_action":"trigger","payload":{"summary":"s","source":"x","severity":"high"}}`,
		"resolve without dedup_key": `{"routing_key":"rk","event_action":"resolve"}`,
		"dedup_key of 256":          `{"routing_key":"rk","event_action":"resolve","dedup_key":"` + strings.Repeat("k", 256) + `"}`,
	}
	for name, ev := range invalid {
		if code, body, _ := post(t, url, nil, ev); code != http.StatusBadRequest || !strings.Contains(body, "invalid event") {
			t.Errorf("%s: %d %s, want 400 invalid event", name, code, body)
		}
	}
	if code, _, _ := post(t, url, nil, `{"routing_key":"rk","event_action":"resolve","dedup_key":"`+strings.Repeat("k", 255)+`"}`); code != http.StatusAccepted {
		t.Errorf("dedup_key of 255: %d, want 202", code)
	}
	if code, _, _ := post(t, pd.URL()+"/v2/other", nil, trigger); code != http.StatusNotFound {
		t.Errorf("other path: %d, want 404", code)
	}

	var actions []string
	for _, ev := range pd.Events() {
		actions = append(actions, ev.EventAction)
	}
	if got := strings.Join(actions, " "); got != "trigger trigger acknowledge resolve resolve" {
		t.Fatalf("accepted events: %s", got)
	}
	first := pd.Events()[0]
	if first.DedupKey != "device/d1" || first.Payload.Summary != "d1 lost" || first.Payload.CustomDetails["devices"] == nil || first.At.IsZero() {
		t.Fatalf("first event recorded as %+v", first)
	}
	if n := len(pd.Calls()); n != 15 {
		t.Fatalf("%d calls recorded, want 15", n)
	}
}

func TestPagerDutyReceiverLimitsEachRoutingKey(t *testing.T) {
	pd := testenv.NewPagerDuty(t, testenv.PagerDutyOptions{Rate: 3, Per: 500 * time.Millisecond})
	ev := func(key string) string {
		return `{"routing_key":"` + key + `","event_action":"resolve","dedup_key":"k"}`
	}
	for i := range 3 {
		if code, body, _ := post(t, pd.EnqueueURL(), nil, ev("a")); code != http.StatusAccepted {
			t.Fatalf("event %d: %d %s", i, code, body)
		}
	}
	if code, body, _ := post(t, pd.EnqueueURL(), nil, ev("a")); code != http.StatusTooManyRequests {
		t.Fatalf("fourth event in the window: %d %s, want 429", code, body)
	}
	if code, _, _ := post(t, pd.EnqueueURL(), nil, ev("b")); code != http.StatusAccepted {
		t.Fatalf("another routing key: %d, want 202", code)
	}
	testenv.WaitFor(t, 2*time.Second, "the window to have room again", func() bool {
		code, _, _ := post(t, pd.EnqueueURL(), nil, ev("a"))
		return code == http.StatusAccepted
	})
	if n := len(pd.Events()); n < 5 {
		t.Fatalf("%d events accepted, want the 429 ones dropped and the rest kept", n)
	}
	var keyA []time.Time
	for _, ev := range pd.Events() {
		if ev.RoutingKey == "a" {
			keyA = append(keyA, ev.At)
		}
	}
	if err := testenv.OverBudget(keyA, 3, 500*time.Millisecond); err != nil {
		t.Fatalf("routing key a: %v", err)
	}
}

func TestSlackReceiverKeepsTheWebhookContract(t *testing.T) {
	sl := testenv.NewSlack(t, testenv.SlackOptions{})
	cases := []struct {
		channel, body string
		code          int
		answer        string
	}{
		{"c1", `{"text":"d1 lost"}`, 200, "ok"},
		{"c2", `{"blocks":[{"type":"section","text":{"type":"mrkdwn","text":"*d1* lost"}}]}`, 200, "ok"},
		{"c3", `{"text":"fallback","blocks":[{"type":"divider"}]}`, 200, "ok"},
		{"c4", `{"username":"x"}`, 400, "no_text"},
		{"c4", `{"text":"","blocks":[]}`, 400, "no_text"},
		{"c4", `{"text":`, 400, "invalid_payload"},
		{"c4", `{"blocks":{"type":"divider"}}`, 400, "invalid_blocks"},
		{"c1", `{"text":"too soon"}`, 429, "rate_limited"},
	}
	for i, c := range cases {
		code, body, h := post(t, sl.WebhookURL(c.channel), nil, c.body)
		if code != c.code || body != c.answer {
			t.Errorf("case %d: %d %q, want %d %q", i, code, body, c.code, c.answer)
		}
		if code == 429 && h.Get("Retry-After") != "1" {
			t.Errorf("429 with Retry-After %q, want 1", h.Get("Retry-After"))
		}
	}
	msgs := sl.Messages()
	if len(msgs) != 3 || msgs[0].Text != "d1 lost" || len(msgs[1].Blocks) != 1 || !strings.HasSuffix(msgs[2].Path, "/c3") {
		t.Fatalf("messages %+v", msgs)
	}
	testenv.WaitFor(t, 3*time.Second, "the channel to take a message again", func() bool {
		code, _, _ := post(t, sl.WebhookURL("c1"), nil, `{"text":"later"}`)
		return code == 200
	})
}

func TestWebhookReceiverVerifiesCountsAndFails(t *testing.T) {
	old, current := webhooks.NewSecret(), webhooks.NewSecret()
	wr := testenv.NewWebhookReceiver(t, old, current)
	send := func(id string, secrets ...webhooks.Secret) (int, http.Header) {
		body := `{"id":"` + id + `"}`
		code, _, h := post(t, wr.URL(), webhooks.Header(secrets, id, time.Now(), []byte(body)), body)
		return code, h
	}
	if code, _ := send("msg_1", old); code != http.StatusNoContent {
		t.Fatalf("old secret: %d, want 204", code)
	}
	if code, _ := send("msg_2", current); code != http.StatusNoContent {
		t.Fatalf("new secret: %d, want 204", code)
	}
	if code, _ := send("msg_3", current, webhooks.NewSecret()); code != http.StatusNoContent {
		t.Fatalf("rotation header: %d, want 204", code)
	}
	if code, _ := send("msg_4", webhooks.NewSecret()); code != http.StatusUnauthorized {
		t.Fatalf("a stranger's secret: %d, want 401", code)
	}
	stale := webhooks.Header([]webhooks.Secret{current}, "msg_5", time.Now().Add(-10*time.Minute), []byte(`{}`))
	if code, _, _ := post(t, wr.URL(), stale, `{}`); code != http.StatusUnauthorized {
		t.Fatalf("a stale timestamp: %d, want 401", code)
	}
	send("msg_1", current)
	if wr.Count("msg_1") != 2 || wr.Count("msg_2") != 1 || wr.Count("msg_4") != 0 || wr.Rejected() != 2 {
		t.Fatalf("counts: msg_1 %d, msg_2 %d, msg_4 %d, rejected %d", wr.Count("msg_1"), wr.Count("msg_2"), wr.Count("msg_4"), wr.Rejected())
	}
	if d := wr.Duplicates(); len(d) != 1 || d[0] != "msg_1" {
		t.Fatalf("duplicates %v, want [msg_1]", d)
	}

	wr.Answer(http.StatusTooManyRequests, 3*time.Second)
	if code, h := send("msg_6", current); code != http.StatusTooManyRequests || h.Get("Retry-After") != "3" {
		t.Fatalf("answering 429: %d Retry-After %q", code, h.Get("Retry-After"))
	}
	wr.Answer(http.StatusGone, 0)
	if code, _ := send("msg_6", current); code != http.StatusGone {
		t.Fatalf("answering 410: %d", code)
	}
	wr.Answer(http.StatusInternalServerError, 0)
	if code, _ := send("msg_6", current); code != http.StatusInternalServerError {
		t.Fatalf("answering 500: %d", code)
	}
	if wr.Count("msg_6") != 0 {
		t.Fatalf("a refused webhook counted as delivered")
	}

	wr.Answer(0, 0)
	wr.Down()
	_, err := plainClient.Post(wr.URL(), "application/json", strings.NewReader(`{}`))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("while down: %v, want connection refused", err)
	}
	wr.Up()
	if code, _ := send("msg_6", current); code != http.StatusNoContent || wr.Count("msg_6") != 1 {
		t.Fatalf("back up on the same port: %d", code)
	}
	if n := len(wr.Deliveries()); n != 5 {
		t.Fatalf("%d deliveries, want 5", n)
	}
}

func TestReceiversRecordConcurrentCalls(t *testing.T) {
	secret := webhooks.NewSecret()
	wr := testenv.NewWebhookReceiver(t, secret)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := "msg_" + string(rune('A'+i))
			body := []byte(`{}`)
			req, _ := http.NewRequest(http.MethodPost, wr.URL(), bytes.NewReader(body))
			for k, v := range webhooks.Header([]webhooks.Secret{secret}, id, time.Now(), body) {
				req.Header[k] = v
			}
			if resp, err := plainClient.Do(req); err == nil {
				resp.Body.Close()
			}
			_ = wr.Calls()
		}()
	}
	wg.Wait()
	calls := wr.Calls()
	if len(calls) != 40 || len(wr.Deliveries()) != 40 || len(wr.Duplicates()) != 0 {
		t.Fatalf("%d calls, %d deliveries, duplicates %v; want 40, 40, none", len(calls), len(wr.Deliveries()), wr.Duplicates())
	}
	for i := 1; i < len(calls); i++ {
		if calls[i].At.Before(calls[i-1].At) {
			t.Fatalf("calls out of arrival order at %d", i)
		}
	}
}

func TestOverBudgetSlidesOverEveryArrival(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, base.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	if err := testenv.OverBudget(at(0, 500, 1000, 1500, 2000), 2, time.Second); err != nil {
		t.Fatalf("2 a second, evenly: %v", err)
	}
	// Two at the end of one second and two in the next: two in each calendar second, but three
	// in the second from 1900ms.
	err := testenv.OverBudget(at(500, 1900, 1950, 2050, 2999), 2, time.Second)
	if err == nil || !strings.Contains(err.Error(), "3 calls") {
		t.Fatalf("a burst across a second's edge: %v, want 3 calls over budget 2", err)
	}
	if err := testenv.OverBudget(nil, 0, time.Second); err != nil {
		t.Fatalf("no calls: %v", err)
	}
}
