package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// fastBatch is a batch of n lost events of shard from.
func fastBatch(p *Bus, from string, lo, hi int) []Message {
	var msgs []Message
	for j := lo; j < hi; j++ {
		msgs = append(msgs, Message{Subject: p.Subjects().Lost("meter"), ID: fmt.Sprintf("%s-%04d@1", from, j), Body: []byte(`{}`)})
	}
	return msgs
}

// tally counts a publish's outcomes.
func tally(t *testing.T, errs []error) (failed, fenced int) {
	t.Helper()
	for _, err := range errs {
		switch {
		case errors.Is(err, ErrFenced):
			fenced++
		case err != nil:
			failed++
		}
	}
	return failed, fenced
}

// TestFencedEventsGoOutInFastBatches proves the fast batch path on a
// single-server stream: a shard's batch is stored whole under its owner's
// fence and confirmed by one answer; a batch overlapping events stored
// before stores each event once and reports none failed; and after another
// owner's fence the earlier owner's batch is refused whole (the stream
// stops at its first message, and the rest, sent message by message, is
// refused by the fence), nothing of it stored.
func TestFencedEventsGoOutInFastBatches(t *testing.T) {
	ctx := context.Background()
	nc, js := natsConn(t)
	p := newPublisher(t, nc, Options{AckWait: 2 * time.Second})
	defer p.Close()
	if !p.fast || p.atomic {
		t.Fatalf("single-server stream: fast %v, atomic %v; want fast batches only", p.fast, p.atomic)
	}
	a, err := p.Fence(ctx, "deadlines", 5, "a", 1)
	if err != nil {
		t.Fatal(err)
	}
	if failed, fenced := tally(t, p.PublishFenced(ctx, a, fastBatch(p, "x", 0, 2500))); failed+fenced != 0 {
		t.Fatalf("sole owner: %d failed, %d fenced", failed, fenced)
	}
	if failed, fenced := tally(t, p.PublishFenced(ctx, a, fastBatch(p, "x", 2400, 2700))); failed+fenced != 0 {
		t.Fatalf("overlapping batch: %d failed, %d fenced", failed, fenced)
	}
	if b, f := testutil.ToFloat64(p.fastBatches), testutil.ToFloat64(p.fastFallbacks); b != 2 || f != 0 {
		t.Errorf("fast batches %v, fallbacks %v; want 2 and 0", b, f)
	}
	if _, err := p.Fence(ctx, "deadlines", 5, "b", 2); err != nil {
		t.Fatal(err)
	}
	if failed, fenced := tally(t, p.PublishFenced(ctx, a, fastBatch(p, "stale", 0, 300))); fenced != 300 || failed != 0 {
		t.Errorf("earlier owner after b fenced: %d fenced, %d failed; want all 300 fenced", fenced, failed)
	}
	ids, err := readIDs(js, p.Subjects().AllLost())
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2700 {
		t.Errorf("stream holds %d distinct events, want 2700", len(ids))
	}
	for id, n := range ids {
		if n != 1 || strings.HasPrefix(id, "stale") {
			t.Errorf("event %s stored %d times", id, n)
		}
	}
}

// TestFastBatchStoredInPart proves a half-acknowledged fast batch: the
// stream stores the first messages of a batch and refuses the rest (here
// its message limit, with new messages discarded). The publisher reports
// the stored ones published and sends the rest message by message, which
// reports each refusal: nothing is reported published that is not stored.
func TestFastBatchStoredInPart(t *testing.T) {
	ctx := context.Background()
	nc, js := natsConn(t)
	const room = 120 // messages the stream takes: the fence and 119 events
	subjects := Subjects{Prefix: "sigwatch"}.Stream()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SIGWATCH", Subjects: subjects,
		Storage: jetstream.FileStorage, Discard: jetstream.DiscardNew, MaxMsgs: room}); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, nc, Options{AckWait: 2 * time.Second, MaxMsgs: room})
	defer p.Close()
	if !p.fast {
		t.Fatal("single-server stream takes no fast batches")
	}
	f, err := p.Fence(ctx, "deadlines", 1, "a", 1)
	if err != nil {
		t.Fatal(err)
	}
	errs := p.PublishFenced(ctx, f, fastBatch(p, "x", 0, 200))
	for j, err := range errs {
		if want := j < room-1; (err == nil) != want {
			t.Fatalf("message %d: error %v; want stored (nil) = %v", j, err, want)
		}
		if errors.Is(err, ErrFenced) {
			t.Fatalf("message %d: %v; want the stream's limit, not a fence", j, err)
		}
	}
	if got := testutil.ToFloat64(p.fastFallbacks); got != 1 {
		t.Errorf("fallbacks %v, want 1", got)
	}
	ids, err := readIDs(js, p.Subjects().AllLost())
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != room-1 {
		t.Errorf("stream holds %d events, want %d", len(ids), room-1)
	}
}

// TestFenceTakenOverMidBatch proves the batch paths when another owner
// fences the shard while a large batch is on its way, on a single server
// (fast batch) and on three replicas (atomic batches): whatever the split,
// every event reported published is stored exactly once, every other one
// is reported fenced out, and nothing of the earlier owner is stored after
// the new fence.
func TestFenceTakenOverMidBatch(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		nc, js := natsConn(t)
		p := newPublisher(t, nc, Options{AckWait: 20 * time.Second})
		defer p.Close()
		fenceMidBatch(t, p, func() (map[string]int, error) { return readIDs(js, p.Subjects().AllLost()) })
	})
	t.Run("replicated", func(t *testing.T) {
		c := testenv.NATSCluster(t)
		p := dialCluster(t, c.URLs(), 20*time.Second)
		fenceMidBatch(t, p, func() (map[string]int, error) { return storedIDs(t, c, p.Subjects().AllLost()), nil })
	})
}

func fenceMidBatch(t *testing.T, p *Bus, stored func() (map[string]int, error)) {
	t.Helper()
	ctx := context.Background()
	a, err := p.Fence(ctx, "deadlines", 7, "a", 1)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20_000
	msgs := fastBatch(p, "a", 0, n)
	done := make(chan []error, 1)
	go func() { done <- p.PublishFenced(ctx, a, msgs) }()
	time.Sleep(20 * time.Millisecond)
	if _, err := p.Fence(ctx, "deadlines", 7, "b", 2); err != nil {
		t.Fatal(err)
	}
	errs := <-done
	ids, err := stored()
	if err != nil {
		t.Fatal(err)
	}
	published, fenced, unknown := 0, 0, 0
	for j, err := range errs {
		id := msgs[j].ID
		switch {
		case err == nil:
			published++
			if ids[id] != 1 {
				t.Fatalf("event %s reported published, stored %d times", id, ids[id])
			}
		case errors.Is(err, ErrFenced):
			fenced++
			if ids[id] != 0 {
				t.Fatalf("event %s reported fenced out, but stored", id)
			}
		default:
			// No answer in time (a busy machine): the caller publishes it
			// again; it may or may not be stored, never twice.
			unknown++
			if ids[id] > 1 {
				t.Fatalf("event %s (%v) stored %d times", id, err, ids[id])
			}
		}
	}
	t.Logf("of %d events, %d published before the new fence, %d fenced out, %d unanswered", n, published, fenced, unknown)
	if fenced == 0 && unknown == n {
		t.Fatal("no event answered")
	}
}
