package dispatch

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestFencedEventsGoOutInAtomicBatches proves the atomic batch path
// against a real nats-server (forced on for a single server): a shard's batch is stored whole under its
// owner's fence, in batches of at most maxAtomicBatch; a batch holding
// events stored before (an earlier owner published them) is refused as a
// batch and goes out message by message, so every event is stored exactly
// once and none is reported failed; and after another owner's fence the
// earlier owner's batch is refused whole, nothing of it stored.
func TestFencedEventsGoOutInAtomicBatches(t *testing.T) {
	ctx := context.Background()
	nc, js := natsConn(t)
	p := newPublisher(t, nc, Options{AckWait: 2 * time.Second})
	if p.atomic {
		t.Fatal("a single-server stream takes atomic batches: want them on replicated streams only")
	}
	// The mechanism is the same on one server; the replicated case is
	// TestFencedBatchOnReplicatedStream.
	p.atomic = true
	publish := func(f Fence, msgs []Message) (failed int, fenced int) {
		for _, err := range p.PublishFenced(ctx, f, msgs) {
			switch {
			case errors.Is(err, ErrFenced):
				fenced++
			case err != nil:
				failed++
				t.Log(err)
			}
		}
		return failed, fenced
	}
	stored := func() map[string]int {
		ids, err := readIDs(js, p.Subjects().AllLost())
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	a, err := p.Fence(ctx, "deadlines", 2, "a", 1)
	if err != nil {
		t.Fatal(err)
	}

	// 2,500 events: three atomic batches, nothing sent one by one.
	if failed, fenced := publish(a, fastBatch(p, "x", 0, 2500)); failed+fenced != 0 {
		t.Fatalf("sole owner: %d failed, %d fenced", failed, fenced)
	}
	if got := testutil.ToFloat64(p.atomicBatches); got != 3 {
		t.Errorf("atomic batches: %v, want 3", got)
	}
	if got := testutil.ToFloat64(p.atomicFallbacks); got != 0 {
		t.Errorf("fallbacks: %v, want 0", got)
	}

	// A batch overlapping what is stored: 100 old events, 200 new.
	if failed, fenced := publish(a, fastBatch(p, "x", 2400, 2700)); failed+fenced != 0 {
		t.Fatalf("overlapping batch: %d failed, %d fenced", failed, fenced)
	}
	if got := testutil.ToFloat64(p.atomicFallbacks); got != 1 {
		t.Errorf("fallbacks: %v, want 1 (the overlapping batch)", got)
	}
	ids := stored()
	if len(ids) != 2700 {
		t.Errorf("stream holds %d distinct events, want 2700", len(ids))
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("event %s stored %d times", id, n)
		}
	}

	// Another owner fences the shard: a's next batch is refused whole.
	if _, err := p.Fence(ctx, "deadlines", 2, "b", 2); err != nil {
		t.Fatal(err)
	}
	if failed, fenced := publish(a, fastBatch(p, "stale", 0, 1500)); fenced != 1500 || failed != 0 {
		t.Errorf("earlier owner after b fenced: %d fenced, %d failed; want all 1500 fenced", fenced, failed)
	}
	for id := range stored() {
		if id[:5] == "stale" {
			t.Fatalf("the fenced-out owner's event %s was stored", id)
		}
	}
}
