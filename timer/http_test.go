package timer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sigwatch/sigwatch/shard"
)

// TestBatchBodyBounded proves that POST /v1/timers/{queue} reads at most
// MaxBatchBody bytes, whatever timers.max_payload allows per timer and
// MaxBatch per request: a body past it is refused with a 413 that names
// the bound and what to do, and nothing is stored; a batch within it of
// MaxBatch resets is stored. (A bound of MaxBatch × (max_payload/16 + 512)
// let one request hold 46 MB by default, 660 MB at the largest
// max_payload, decoded whole into memory.)
func TestBatchBodyBounded(t *testing.T) {
	h := newHarness(t, 4)
	s := h.service("a", func(o *Options) { o.Fire = false })
	mux := http.NewServeMux()
	s.Routes(mux)
	srv := httptest.NewServer(mux)
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
	for j := 0; big.Len() <= int(MaxBatchBody(DefaultMaxPayload)); j++ {
		if j > 0 {
			big.WriteString(",")
		}
		fmt.Fprintf(&big, `{"id":"t%d","after":"1h","payload":%q}`, j, payload)
	}
	big.WriteString("]")
	if code, body := post(big.Bytes()); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, fmt.Sprint(MaxBatchBody(DefaultMaxPayload))) ||
		!strings.Contains(body, "several requests") {
		t.Errorf("a %d-byte batch: %d %s, want 413 naming the bound %d", big.Len(), code, body, MaxBatchBody(DefaultMaxPayload))
	}
	for i := range 4 {
		if n, err := h.store.Size(t.Context(), shard.Timers, i); err != nil || n != 0 {
			t.Errorf("shard %d holds %d timers (%v) after a refused batch, want 0", i, n, err)
		}
	}
	var ok []Request
	for j := range MaxBatch {
		ok = append(ok, Request{ID: fmt.Sprintf("s%d", j), After: json.RawMessage(`"1h"`)})
	}
	b, _ := json.Marshal(ok)
	if code, body := post(b); code != http.StatusOK {
		t.Errorf("a batch of %d small resets (%d bytes): %d %s, want 200", MaxBatch, len(b), code, body)
	}
}
