package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/timer"
)

// TestBatchBodyBounded proves that POST /v1/timers/{queue} reads at most
// MaxBatchBody bytes, whatever timers.max_payload allows per timer and
// MaxBatch per request: a body past it is refused with a 413 that names
// the bound and what to do, and nothing is stored; a batch within it of
// MaxBatch resets is stored. (A bound of MaxBatch × (max_payload/16 + 512)
// let one request hold 46 MB by default, 660 MB at the largest
// max_payload, decoded whole into memory.)
func TestBatchBodyBounded(t *testing.T) {
	store, s := timerService(t, 4)
	srv := httptest.NewServer(New(Options{Timers: s, Gatherer: prometheus.NewRegistry()}).Handler())
	t.Cleanup(srv.Close)
	post := func(body []byte) (int, string) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/v1/timers/q", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	// Many resets whose payloads are each far below max_payload.
	payload := strings.Repeat("x", 4000)
	var big bytes.Buffer
	big.WriteString("[")
	for j := 0; big.Len() <= int(timer.MaxBatchBody(timer.DefaultMaxPayload)); j++ {
		if j > 0 {
			big.WriteString(",")
		}
		fmt.Fprintf(&big, `{"id":"t%d","after":"1h","payload":%q}`, j, payload)
	}
	big.WriteString("]")
	if code, body := post(big.Bytes()); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, fmt.Sprint(timer.MaxBatchBody(timer.DefaultMaxPayload))) ||
		!strings.Contains(body, "several requests") {
		t.Errorf("a %d-byte batch: %d %s, want 413 naming the bound %d", big.Len(), code, body, timer.MaxBatchBody(timer.DefaultMaxPayload))
	}
	for i := range 4 {
		if n, err := store.Size(t.Context(), shard.Timers, i); err != nil || n != 0 {
			t.Errorf("shard %d holds %d timers (%v) after a refused batch, want 0", i, n, err)
		}
	}
	var ok []timer.Request
	for j := range timer.MaxBatch {
		ok = append(ok, timer.Request{ID: fmt.Sprintf("s%d", j), After: json.RawMessage(`"1h"`)})
	}
	b, _ := json.Marshal(ok)
	if code, body := post(b); code != http.StatusOK {
		t.Errorf("a batch of %d small resets (%d bytes): %d %s, want 200", timer.MaxBatch, len(b), code, body)
	}
}

// timerService is a timer service that stores resets (it fires none) on
// shards shards of a fresh Redis, until the test ends.
func timerService(t *testing.T, shards int) (*shard.Store, *timer.Service) {
	t.Helper()
	env := testenv.New(t, testenv.Options{NATS: true})
	store := env.Store(t, "sw")
	topo, err := shard.NewWatcher(t.Context(), store, shards, 100*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	nc := env.Conn(t, nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	pub, err := dispatch.New(t.Context(), nc, dispatch.Options{AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := timer.New(timer.Options{Replica: "a"}, store, topo, pub, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return store, s
}
