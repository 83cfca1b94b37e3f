package client_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/client"
)

// TestRequestAnswersOnceStored proves the request path: Request returns
// once the reset is stored (Get finds it at once, no stream in between),
// many requests in flight together are each stored and answered, a request
// with one bad reset is refused whole with a 400 naming it and stores
// nothing, and a subject no sigwatch serves answers 503.
func TestRequestAnswersOnceStored(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if err := c.Request(ctx, "req", client.Reset{ID: "one", At: at, Payload: map[string]int{"n": 1}}); err != nil {
		t.Fatal(err)
	}
	tm, ok, err := c.Get(ctx, "req", "one")
	if err != nil || !ok || tm.Deadline != at.UnixMilli() || string(tm.Payload) != `{"n":1}` {
		t.Fatalf("after Request: %+v, %v, %v; want it stored at %d with its payload", tm, ok, err, at.UnixMilli())
	}

	const n = 500
	var wg sync.WaitGroup
	errs := make([]error, n)
	for k := range n {
		wg.Go(func() { errs[k] = c.Request(ctx, "req", client.Reset{ID: fmt.Sprintf("m%d", k), After: time.Hour}) })
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", k, err)
		}
	}
	for _, id := range []string{"m0", fmt.Sprintf("m%d", n-1)} {
		if _, ok, err := c.Get(ctx, "req", id); err != nil || !ok {
			t.Errorf("%s not stored after its answer: %v", id, err)
		}
	}

	err = c.Request(ctx, "req", client.Reset{ID: "good", After: time.Minute}, client.Reset{ID: "", After: time.Minute})
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 400 || e.Temporary() {
		t.Fatalf("a request with an empty id: %v, want a 400", err)
	}
	t.Logf("refused: %v", err)
	if _, ok, _ := c.Get(ctx, "req", "good"); ok {
		t.Error("a refused request stored its good reset")
	}

	other, err := client.New(client.Options{URL: sigwatchURL, NATS: natsConn, Prefix: "elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Request(ctx, "req", client.Reset{ID: "x", After: time.Minute}); !errors.As(err, &e) || e.Status != 503 || !e.Temporary() {
		t.Fatalf("no one serving: %v, want a temporary 503", err)
	}
	// Malformed JSON sent by hand is refused with a reason, not dropped.
	m, err := natsConn.RequestWithContext(ctx, "sigwatch.timers.reset.req", []byte(`{not json`))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(m.Data); !strings.Contains(got, `"status":400`) || !strings.Contains(got, "bad_json") {
		t.Errorf("malformed request answered %q, want a 400 naming bad_json", got)
	}
}
