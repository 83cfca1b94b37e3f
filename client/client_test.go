package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/client"
)

func newClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{URL: sigwatchURL, NATS: natsConn})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestResetModesAndOddIDs(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	id := `meter/7 <b>"x"</b> & ü?#%`
	late, err := c.Reset(ctx, "modes", id, time.Hour, map[string]int{"v": 1})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Reset(ctx, "modes", id, time.Minute, nil)
	if err != nil || got.Deadline != late.Deadline {
		t.Fatalf("an earlier extend moved the deadline: %+v %v (was %d)", got, err, late.Deadline)
	}
	got, err = c.ResetWith(ctx, "modes", client.Reset{ID: id, After: time.Minute, Mode: client.Set})
	if err != nil || got.Deadline >= late.Deadline {
		t.Fatalf("set did not move it earlier: %+v %v", got, err)
	}
	g, ok, err := c.Get(ctx, "modes", id)
	if err != nil || !ok || g.ID != id || g.Deadline != got.Deadline || string(g.Payload) != `{"v":1}` {
		t.Fatalf("get: %+v %v %v", g, ok, err)
	}
	if _, err := c.ResetWith(ctx, "modes", client.Reset{ID: id, After: time.Minute, Payload: client.ClearPayload}); err != nil {
		t.Fatal(err)
	}
	if g, _, _ := c.Get(ctx, "modes", id); g.Payload != nil {
		t.Fatalf("payload %s after clearing", g.Payload)
	}
	if ok, err := c.Cancel(ctx, "modes", id); !ok || err != nil {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	if _, ok, err := c.Get(ctx, "modes", id); ok || err != nil {
		t.Fatalf("get after cancel: %v %v", ok, err)
	}
	if ok, err := c.Cancel(ctx, "modes", id); ok || err != nil {
		t.Fatalf("second cancel: %v %v", ok, err)
	}
}

func TestBadInputIsRefused(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	for _, q := range []string{"", "a.b", "a*", "a>", "a b", string(make([]byte, 65))} {
		if _, err := c.Reset(ctx, q, "x", time.Second, nil); err == nil {
			t.Errorf("queue %q accepted", q)
		}
	}
	_, err := c.Reset(ctx, "q", "", time.Second, nil)
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 400 || e.Temporary() {
		t.Fatalf("empty id: %v", err)
	}
	if _, err := c.Reset(ctx, "q", "x", time.Second, json.RawMessage(`{not json`)); err == nil {
		t.Fatal("a payload that is not JSON was accepted")
	}
	if err := c.ResetBatch(ctx, "q", []client.Reset{{ID: "ok", After: time.Minute}, {ID: "", After: time.Minute}}); !errors.As(err, &e) || e.Status != 400 {
		t.Fatalf("bad batch: %v", err)
	}
	if _, ok, _ := c.Get(ctx, "q", "ok"); ok {
		t.Fatal("a batch with a bad reset stored its good one")
	}
}

func TestBatchPublishAndSubscribeRedelivers(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	var (
		mu    sync.Mutex
		got   = map[string]int{}
		fails atomic.Int32
	)
	sub, err := c.Subscribe(ctx, "jobs", "workers", func(_ context.Context, ev client.Event) error {
		if ev.Timer == "flaky" && fails.Add(1) == 1 {
			return errors.New("not now")
		}
		mu.Lock()
		got[ev.Timer]++
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	var batch []client.Reset
	for j := range 50 {
		batch = append(batch, client.Reset{ID: fmt.Sprint("b-", j), After: 200 * time.Millisecond, Payload: j})
	}
	if err := c.ResetBatch(ctx, "jobs", batch); err != nil {
		t.Fatal(err)
	}
	var pubs []client.Reset
	for j := range 50 {
		pubs = append(pubs, client.Reset{ID: fmt.Sprint("n-", j), At: time.Now().Add(300 * time.Millisecond)})
	}
	pubs = append(pubs, client.Reset{ID: "flaky", After: 200 * time.Millisecond})
	if err := c.Publish(ctx, "jobs", pubs...); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 101 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 101 || fails.Load() != 2 {
		t.Fatalf("handled %d timers (want 101), flaky tried %d times (want 2)", len(got), fails.Load())
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("%s handled %d times", id, n)
		}
	}
}
