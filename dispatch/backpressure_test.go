package dispatch

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestPublishersWaitForRoomInsteadOfFailing proves the back-pressure of
// the asynchronous publishes: more batches in flight than MaxPending allows
// (more shard loops than it was sized for, after a doubling, or several
// families firing at once) wait for room while the server is slow to
// acknowledge, and every message is stored once it answers, instead of
// failing with "too many outstanding async published messages".
func TestPublishersWaitForRoomInsteadOfFailing(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	proxy := testenv.NewProxy(t, strings.TrimPrefix(env.NATS.URL, "nats://"))
	nc, err := nats.Connect("nats://"+proxy.Addr, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx := context.Background()
	const pending, loops, batch = 16, 8, 12
	p, err := New(ctx, nc, Options{Storage: "memory", MaxPending: pending, AckWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	proxy.Hold() // the server is slow: no acknowledgement for a while
	var wg sync.WaitGroup
	errs := make([][]error, loops)
	for l := range loops {
		wg.Go(func() {
			msgs := make([]Message, batch)
			for k := range msgs {
				id := fmt.Sprintf("l%d-m%d", l, k)
				msgs[k] = Message{Subject: p.Subjects().System(), ID: id, Body: []byte(`{"id":"` + id + `"}`)}
			}
			errs[l] = p.Publish(ctx, msgs)
		})
	}
	time.Sleep(time.Second) // far past the client's own stall wait (200ms)
	proxy.Release()
	wg.Wait()
	for l, es := range errs {
		for k, err := range es {
			if err != nil {
				t.Errorf("loop %d message %d: %v", l, k, err)
			}
		}
	}
}
