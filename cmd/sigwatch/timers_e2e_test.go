package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// freeAddr is a loopback address with a free port, for a process's API.
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// apiCall sends a JSON request to the API at addr and returns the status and
// body.
func apiCall(t *testing.T, method, addr, path, token string, body any) (int, string) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, "http://"+addr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type timerBody struct {
	ID      string          `json:"id,omitempty"`
	After   string          `json:"after,omitempty"`
	At      int64           `json:"at,omitempty"`
	Mode    string          `json:"mode,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// TestTimersAPIEndToEnd drives the timer API of a running process with a
// token: every call, and the refusals a user can run into.
func TestTimersAPIEndToEnd(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	addr := freeAddr(t)
	const token = "s3cret"
	startProc(t, env, "sigwatch", "SIGWATCH_HTTP_ADDR="+addr, "SIGWATCH_HTTP_TOKEN="+token, "SIGWATCH_TIMERS_MAX_PAYLOAD=64")
	testenv.WaitFor(t, 30*time.Second, "the API", func() bool {
		code, _ := apiCall(t, "GET", addr, "/v1/timers/q/none", token, nil)
		return code == http.StatusNotFound
	})
	if code, _ := apiCall(t, "GET", addr, "/v1/timers/q/none", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d", code)
	}
	put := func(path string, b any) (int, string) { return apiCall(t, "PUT", addr, path, token, b) }
	code, body := put("/v1/timers/orders/o%2F1%20%23", timerBody{After: "1h", Payload: json.RawMessage(`{"c":1}`)})
	var got struct {
		Queue, ID string
		Deadline  int64
		Payload   json.RawMessage
	}
	if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil || got.ID != "o/1 #" || got.Queue != "orders" {
		t.Fatalf("PUT: %d %s", code, body)
	}
	code, body = put("/v1/timers/orders/o%2F1%20%23", timerBody{At: time.Now().Add(time.Minute).UnixMilli()})
	var after struct{ Deadline int64 }
	_ = json.Unmarshal([]byte(body), &after)
	if code != 200 || after.Deadline != got.Deadline {
		t.Fatalf("an earlier extend answered %d %s, want the deadline %d kept", code, body, got.Deadline)
	}
	code, body = apiCall(t, "GET", addr, "/v1/timers/orders/o%2F1%20%23", token, nil)
	if code != 200 || !strings.Contains(body, `"payload":{"c":1}`) {
		t.Fatalf("GET: %d %s", code, body)
	}
	if code, body = apiCall(t, "POST", addr, "/v1/timers/orders", token, []timerBody{{ID: "a", After: "1h"}, {ID: "b", After: "2h", Mode: "set"}}); code != 200 || !strings.Contains(body, `"stored":2`) {
		t.Fatalf("POST: %d %s", code, body)
	}
	if code, _ = apiCall(t, "DELETE", addr, "/v1/timers/orders/a", token, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d", code)
	}
	if code, _ = apiCall(t, "DELETE", addr, "/v1/timers/orders/a", token, nil); code != http.StatusNotFound {
		t.Fatalf("DELETE again: %d", code)
	}
	for _, c := range []struct {
		path string
		body any
		want int
	}{
		{"/v1/timers/a.b/x", timerBody{After: "1s"}, 400},
		{"/v1/timers/a*/x", timerBody{After: "1s"}, 400},
		{"/v1/timers/" + strings.Repeat("q", 65) + "/x", timerBody{After: "1s"}, 400},
		{"/v1/timers/q/%00", timerBody{After: "1s"}, 400},
		{"/v1/timers/q/$sigwatch-x", timerBody{After: "1s"}, 400},
		{"/v1/timers/q/x", `{"after":"1s","payload":{not json}}`, 400},
		{"/v1/timers/q/x", timerBody{After: "1s", Payload: json.RawMessage(`"` + strings.Repeat("p", 100) + `"`)}, 400},
		{"/v1/timers/q/x", timerBody{After: "1s", At: 1}, 400},
		{"/v1/timers/q/x", timerBody{}, 400},
		{"/v1/timers/q/x", timerBody{After: "1s", Mode: "sooner"}, 400},
		{"/v1/timers/q/x", `not json`, 400},
	} {
		if code, body := put(c.path, c.body); code != c.want || !strings.Contains(body, `"error"`) {
			t.Errorf("PUT %s %v: %d %s, want %d with an error", c.path, c.body, code, body, c.want)
		}
	}
	// The CLI does the same through the API.
	cli := func(args ...string) (string, error) {
		return runCLI(t, addr, append(append([]string{"timer"}, args...), "--token", token)...)
	}
	if out, err := cli("set", "jobs", "a b/c", "--after", "1h", "--payload", `{"k":[1]}`, "--json"); err != nil || !strings.Contains(out, `"id": "a b/c"`) {
		t.Fatalf("timer set: %v\n%s", err, out)
	}
	if out, err := cli("get", "jobs", "a b/c", "--json"); err != nil || !strings.Contains(out, `"k"`) {
		t.Fatalf("timer get: %v\n%s", err, out)
	}
	if out, err := cli("rm", "jobs", "a b/c"); err != nil || !strings.Contains(out, "cancelled") {
		t.Fatalf("timer rm: %v\n%s", err, out)
	}
	if out, err := cli("get", "jobs", "a b/c"); err == nil || !strings.Contains(out, "no timer") {
		t.Fatalf("timer get after rm: %v\n%s", err, out)
	}
	if code, body = apiCall(t, "POST", addr, "/v1/timers/orders", token, []timerBody{{ID: "c", After: "1h"}, {ID: "", After: "1h"}}); code != 400 || !strings.Contains(body, "timer 1") {
		t.Fatalf("a batch with a bad reset: %d %s", code, body)
	}
	if code, _ = apiCall(t, "GET", addr, "/v1/timers/orders/c", token, nil); code != http.StatusNotFound {
		t.Fatalf("the good reset of a refused batch was stored: %d", code)
	}
}

// timerFire is one timer event read back from the stream.
type timerFire struct {
	ev     dispatch.Timer
	msgID  string
	stored time.Time
}

// readTimerEvents reads every timer event in the stream SIGWATCH.
func readTimerEvents(t *testing.T, nc *nats.Conn, want int) []timerFire {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cons, err := js.OrderedConsumer(ctx, "SIGWATCH", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"sigwatch.timer.>"}})
	if err != nil {
		t.Fatal(err)
	}
	var out []timerFire
	empty := 0
	for len(out) < want && empty < 3 {
		batch, err := cons.Fetch(5000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var f timerFire
			if err := json.Unmarshal(m.Data(), &f.ev); err != nil {
				t.Fatalf("event %s: %v", m.Data(), err)
			}
			f.msgID = m.Headers().Get("Nats-Msg-Id")
			if md, err := m.Metadata(); err == nil {
				f.stored = md.Timestamp
			}
			out = append(out, f)
		}
		if n == 0 {
			empty++
		}
	}
	return out
}

// timerEventCount is how many timer events the stream holds.
func timerEventCount(nc *nats.Conn) int {
	js, err := jetstream.New(nc)
	if err != nil {
		return -1
	}
	return storedOn(js, "SIGWATCH", "sigwatch.timer.>")
}

// TestTimersFireOnceAcrossFaults loads 100,000 timers across 10 queues,
// half over HTTP and half published over NATS, into two processes, and
// while they fall due doubles the shards, kills one process with -9 (and
// starts it again) and restarts the NATS server. A tenth of the timers are
// reset to later deadlines meanwhile. Every timer fires exactly once (one
// id on the stream), at its last deadline, none before it.
func TestTimersFireOnceAcrossFaults(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	addrA, addrB := freeAddr(t), freeAddr(t)
	cfg := []string{"SIGWATCH_SHARDS_INITIAL=4", "SIGWATCH_SCANNER_LEASE_TTL=1500ms", "SIGWATCH_ROLES=ingest,scanner,api"}
	startProc(t, env, "a", append(cfg, "SIGWATCH_HTTP_ADDR="+addrA, "SIGWATCH_MQTT_CLIENT_ID=timers-a")...)
	b := startProc(t, env, "b", append(cfg, "SIGWATCH_HTTP_ADDR="+addrB, "SIGWATCH_MQTT_CLIENT_ID=timers-b")...)
	nc := env.Conn(t, nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	testenv.WaitFor(t, 30*time.Second, "both APIs and the reset stream", func() bool {
		ca, _ := apiCall(t, "GET", addrA, "/v1/timers/q/none", "", nil)
		cb, _ := apiCall(t, "GET", addrB, "/v1/timers/q/none", "", nil)
		_, err := js.Stream(ctx, "SIGWATCH_TIMERS")
		return ca == 404 && cb == 404 && err == nil
	})

	const n, queues = 100_000, 10
	// Loading takes 3 s on a quiet machine and up to 18 s beside the rest
	// of the suite on two cores.
	start := time.Now().Add(30 * time.Second)
	spread := 20 * time.Second
	last := make(map[string]int64, n) // member -> last deadline
	var viaHTTP, viaNATS [queues][]timerBody
	for j := range n {
		q := j % queues
		id := fmt.Sprintf("t-%06d", j)
		at := start.Add(time.Duration(j) * spread / n).UnixMilli()
		last[shard.TimerMember(fmt.Sprint("q", q), id)] = at
		tb := timerBody{ID: id, At: at}
		if j%7 == 0 {
			tb.Payload = json.RawMessage(fmt.Sprintf(`{"j":%d}`, j))
		}
		if j%2 == 0 {
			viaHTTP[q] = append(viaHTTP[q], tb)
		} else {
			viaNATS[q] = append(viaNATS[q], tb)
		}
	}
	loaded := time.Now()
	for q := range queues {
		for lo := 0; lo < len(viaHTTP[q]); lo += 5000 {
			addr := addrA
			if lo%10000 != 0 {
				addr = addrB
			}
			if code, body := apiCall(t, "POST", addr, fmt.Sprintf("/v1/timers/q%d", q), "", viaHTTP[q][lo:min(lo+5000, len(viaHTTP[q]))]); code != 200 {
				t.Fatalf("POST: %d %s", code, body)
			}
		}
		for lo := 0; lo < len(viaNATS[q]); lo += 500 {
			data, _ := json.Marshal(viaNATS[q][lo:min(lo+500, len(viaNATS[q]))])
			if _, err := js.Publish(ctx, fmt.Sprintf("sigwatch.timers.set.q%d", q), data); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("loaded %d timers in %v; the first falls due in %v", n, time.Since(loaded).Round(time.Millisecond), time.Until(start).Round(time.Millisecond))
	if time.Until(start) < 2*time.Second {
		t.Fatalf("loading took too long: the first timers are due before the faults")
	}
	// A tenth are pushed back 3 s, half of them over NATS, while the others
	// fall due.
	reset := func(from, to int) {
		for q := range queues {
			var batch []timerBody
			for j := from + q; j < to; j += queues * 10 {
				id := fmt.Sprintf("t-%06d", j)
				m := shard.TimerMember(fmt.Sprint("q", q), id)
				last[m] += 3000
				batch = append(batch, timerBody{ID: id, At: last[m], Payload: json.RawMessage(`"reset"`)})
			}
			if len(batch) == 0 {
				continue
			}
			if q%2 == 0 {
				if code, body := apiCall(t, "POST", addrA, fmt.Sprintf("/v1/timers/q%d", q), "", batch); code != 200 {
					t.Fatalf("reset POST: %d %s", code, body)
				}
			} else {
				data, _ := json.Marshal(batch)
				if _, err := js.Publish(ctx, fmt.Sprintf("sigwatch.timers.set.q%d", q), data); err != nil {
					t.Fatalf("reset publish: %v", err)
				}
			}
		}
	}
	sleepUntil := func(at time.Time) { time.Sleep(time.Until(at)) }

	sleepUntil(start.Add(2 * time.Second))
	if code, body := apiCall(t, "POST", addrA, "/v1/shards/double", "", nil); code != 200 {
		t.Fatalf("double: %d %s", code, body)
	}
	t.Log("doubling 4 -> 8")
	// Timers due from 6 s on, reset before they fall due, across the
	// doubling.
	reset(n*6/20, n*8/20)
	sleepUntil(start.Add(5 * time.Second))
	b.kill()
	t.Log("b killed (-9)")
	sleepUntil(start.Add(8 * time.Second))
	startProc(t, env, "b2", append(cfg, "SIGWATCH_HTTP_ADDR="+addrB, "SIGWATCH_MQTT_CLIENT_ID=timers-b")...)
	t.Log("b started again")
	sleepUntil(start.Add(10 * time.Second))
	reset(n*12/20, n*14/20)
	if err := env.NATS.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Log("NATS restarted")

	waitUntil := time.Now().Add(spread + 60*time.Second)
	for c := timerEventCount(nc); c < n; c = timerEventCount(nc) {
		if time.Now().After(waitUntil) {
			_, shards := apiCall(t, "GET", addrA, "/v1/shards", "", nil)
			_, metrics := apiCall(t, "GET", addrA, "/metrics", "", nil)
			var tm []string
			for _, l := range strings.Split(metrics, "\n") {
				if strings.HasPrefix(l, "sigwatch_timers_") || strings.Contains(l, `family="timers"`) {
					tm = append(tm, l)
				}
			}
			fired := map[string]bool{}
			for _, f := range readTimerEvents(t, nc, c) {
				fired[shard.TimerMember(f.ev.Queue, f.ev.Timer)] = true
			}
			bySecond, byPath, byQueue := map[int64]int{}, map[int]int{}, map[string]int{}
			for m, d := range last {
				if !fired[m] {
					bySecond[(d-start.UnixMilli())/1000]++
					q, id, _ := shard.SplitTimerMember(m)
					j, _ := strconv.Atoi(strings.TrimPrefix(id, "t-"))
					byPath[j%2]++
					byQueue[q]++
				}
			}
			t.Fatalf("%d of %d timers fired; missing by second due %v, by path (0 http, 1 nats) %v, by queue %v; shards %s\n%s",
				c, n, bySecond, byPath, byQueue, shards, strings.Join(tm, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	testenv.WaitFor(t, 30*time.Second, "the doubling drained", func() bool {
		code, body := apiCall(t, "GET", addrA, "/v1/shards", "", nil)
		return code == 200 && strings.Contains(body, `"prev":0`)
	})
	time.Sleep(2 * time.Second) // a duplicate would land by now
	fires := readTimerEvents(t, nc, n+1)
	byMember := make(map[string]int, n)
	ids := make(map[string]int, n)
	var early, wrongDeadline, badID int
	for _, f := range fires {
		m := shard.TimerMember(f.ev.Queue, f.ev.Timer)
		byMember[m]++
		ids[f.msgID]++
		if f.msgID != f.ev.ID || f.ev.ID != dispatch.TimerID(f.ev.Queue, f.ev.Timer, f.ev.Deadline) {
			badID++
		}
		if f.ev.Deadline != last[m] {
			wrongDeadline++
			if wrongDeadline <= 5 {
				t.Errorf("%s fired at %d, its last deadline is %d", m, f.ev.Deadline, last[m])
			}
		}
		if f.ev.FiredAt < f.ev.Deadline || f.stored.UnixMilli() < f.ev.Deadline-50 {
			early++
			if early <= 5 {
				t.Errorf("%s fired early: deadline %d, fired_at %d, stored %d", m, f.ev.Deadline, f.ev.FiredAt, f.stored.UnixMilli())
			}
		}
	}
	missing, twice := 0, 0
	for m := range last {
		switch byMember[m] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	if len(fires) != n || missing > 0 || twice > 0 || len(ids) != n || early > 0 || wrongDeadline > 0 || badID > 0 {
		t.Fatalf("%d events for %d timers: %d missing, %d fired more than once, %d distinct ids, %d early, %d not at their last deadline, %d with a wrong id",
			len(fires), n, missing, twice, len(ids), early, wrongDeadline, badID)
	}
	st, err := js.Stream(ctx, "SIGWATCH_TIMERS")
	if err != nil || st.CachedInfo().State.Msgs != 0 {
		t.Fatalf("resets left unacknowledged: %v", err)
	}
	t.Logf("%d timers fired exactly once each, none early, each at its last deadline", n)
}
