package scanner

import (
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
)

// fenceDuplicates is the stream's de-duplication window in the fence
// tests: the stale owner is held past it.
const fenceDuplicates = 2 * time.Second

// shortWindow gives h a stream whose de-duplication window is
// fenceDuplicates.
func (h *harness) shortWindow() {
	h.t.Helper()
	js, err := jetstream.New(h.nc)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := js.DeleteStream(h.ctx, "SIGWATCH"); err != nil {
		h.t.Fatal(err)
	}
	// The server removes a deleted stream's files after it answers: a
	// stream created at once may find its directory going, and is tried
	// again.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		h.pub, err = dispatch.New(h.ctx, h.nc, dispatch.Options{AckWait: time.Second, Duplicates: fenceDuplicates})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatal(err)
		}
	}
}

// TestStaleOwnerPublishesNothingAfterLosingItsLease proves invariant 11
// with the exact interleaving: replica a claims a batch and, before it
// publishes, loses Redis (its lease expires, b takes the shard, fires the
// batch and the devices come back); a is released after more than the
// stream's de-duplication window. The stream must still hold one lost
// event per deadline, and no lost mark of a's may be left on the devices
// that came back.
func TestStaleOwnerPublishesNothingAfterLosingItsLease(t *testing.T) {
	h := newHarness(t, 1)
	h.shortWindow()
	h.advanceWatermark()

	// a reaches Redis through a proxy that the test holds: a Redis outage
	// seen by a alone, as a pause or a network partition would be.
	a, proxy := h.scannerBehindProxy("a")
	held, release := holdFirstPublish(a)

	const n = 20
	now := time.Now().UnixMilli()
	var ids []string
	for k := range n {
		id := fmt.Sprintf("dev-%02d", k)
		ids = append(ids, id)
		h.add(shard.Entry{ID: id, Deadline: now - 10})
	}
	stopA := h.run(a)
	<-held
	proxy.Hold()

	b, _ := h.scanner("b", nil)
	stopB := h.run(b)
	testenv.WaitFor(t, 10*time.Second, "b to fire the batch a holds", func() bool { return len(h.streamLost()) == n })
	// The devices come back, as ingest records it: the lost mark is
	// cleared and a later deadline written.
	var back []shard.Sighting
	for _, id := range ids {
		back = append(back, shard.Sighting{ID: id})
	}
	for _, s := range h.store.SeenMulti(h.ctx, back, time.Now().UnixMilli()) {
		if s.Err != nil {
			t.Fatal(s.Err)
		}
	}
	for _, id := range ids {
		h.add(shard.Entry{ID: id, Deadline: time.Now().Add(time.Hour).UnixMilli()})
	}
	firedB := time.Now()

	// a comes back after the window has passed.
	time.Sleep(time.Until(firedB.Add(fenceDuplicates + 500*time.Millisecond)))
	proxy.Release()
	close(release)
	// a's publish, refused or not, is answered within its ack wait; its
	// mark, if any, follows at once.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if sum(h.streamLost()) > n {
			time.Sleep(500 * time.Millisecond)
			break
		}
	}
	stopA()
	stopB()

	stored := h.streamLost()
	dup := storedTwice(t, stored)
	devs, err := h.store.Devices(h.ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	marked := 0
	for j, d := range devs {
		if d.LostDeadline != 0 {
			marked++
			t.Errorf("%s came back but carries the lost mark %d:%d", ids[j], d.LostDeadline, d.LostAt)
		}
	}
	t.Logf("%d deadlines, %d lost messages stored, %d ids stored twice, %d live devices marked lost",
		n, sum(stored), dup, marked)
}

// TestRepublishAfterLongOutageStoresNoSecondEvent proves invariant 11 for
// the event that was stored but not settled: replica a publishes a batch
// (the stream stores it) and loses Redis before it settles; b takes the
// shard only after more than the de-duplication window and finds the batch
// still due. b must not store the events a second time.
func TestRepublishAfterLongOutageStoresNoSecondEvent(t *testing.T) {
	h := newHarness(t, 1)
	h.shortWindow()
	h.advanceWatermark()

	a, proxy := h.scannerBehindProxy("a")
	held := make(chan struct{})
	var once sync.Once
	a.afterPublish = func(int) {
		once.Do(func() {
			proxy.Hold() // a cannot settle, renew or heartbeat
			close(held)
		})
	}
	const n = 20
	now := time.Now().UnixMilli()
	for k := range n {
		h.add(shard.Entry{ID: fmt.Sprintf("dev-%02d", k), Deadline: now - 10})
	}
	h.run(a)
	<-held
	stored := time.Now()
	if got := sum(h.streamLost()); got != n {
		t.Fatalf("a stored %d lost events before it lost Redis, want %d", got, n)
	}
	// b starts once the window has passed since a's events were stored.
	time.Sleep(time.Until(stored.Add(fenceDuplicates + 500*time.Millisecond)))
	b, _ := h.scanner("b", nil)
	h.run(b)
	testenv.WaitFor(t, 10*time.Second, "b to settle the batch a left", func() bool {
		for k := range n {
			if _, ok := h.score(fmt.Sprintf("dev-%02d", k)); ok {
				return false
			}
		}
		return true
	})
	proxy.Release()
	ids := h.streamLost()
	twice := storedTwice(t, ids)
	t.Logf("%d deadlines: %d lost messages stored, %d ids stored twice", n, sum(ids), twice)
}

// holdFirstPublish makes s stop before its first publish, after it has
// claimed and marked the batch: held is closed then, and s goes on once
// release is closed.
func holdFirstPublish(s *Scanner) (held <-chan struct{}, release chan struct{}) {
	h, r := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.h.beforePublish = func(int) {
		once.Do(func() {
			close(h)
			<-r
		})
	}
	return h, r
}

// scannerBehindProxy returns a scanner that reaches Redis through a proxy
// the test holds: a Redis outage seen by that replica alone.
func (h *harness) scannerBehindProxy(replica string) (*Scanner, *testenv.Proxy) {
	h.t.Helper()
	proxy := testenv.NewProxy(h.t, h.env.Redis.Addr)
	store := testenv.StoreOn(h.t, []string{proxy.Addr}, "sw")
	topo, err := shard.NewWatcher(h.ctx, store, h.shards, time.Second, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(h.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := New(Options{Replica: replica, Rebalance: 100 * time.Millisecond,
		Config: queue.Config{LeaseTTL: time.Second, Poll: 10 * time.Millisecond, Batch: 64}, Thresholds: shard.NewThresholds(store, threshold, nil)},
		store, topo, h.pub, prometheus.NewRegistry(), log.With("replica", replica))
	if err != nil {
		h.t.Fatal(err)
	}
	return s, proxy
}
