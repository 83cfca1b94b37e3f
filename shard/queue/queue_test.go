package queue

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// The engine's own behaviour, with a test handler. The lost-event handler
// and the invariants seen through it (leases, take-over, fencing, the
// crossing rule, doublings) are proved in package scanner.

// harness is one test's Redis, store and topology of one shard.
type harness struct {
	t     *testing.T
	ctx   context.Context
	store *shard.Store
	topo  *shard.Watcher
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	env := testenv.New(t, testenv.Options{})
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{env.Redis.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	store := shard.NewStore(c, shard.NewKeys("sw"))
	topo, err := shard.NewWatcher(ctx, store, 1, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.AdvanceWatermark(ctx, time.Now().Add(time.Hour).UnixMilli(), time.Hour); err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, ctx: ctx, store: store, topo: topo}
}

func (h *harness) add(es ...shard.Entry) {
	h.t.Helper()
	if _, err := h.store.Upsert(h.ctx, shard.Deadlines, map[int][]shard.Entry{0: es}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) score(id string) (int64, bool) {
	h.t.Helper()
	sc, ok, err := h.store.Score(h.ctx, shard.Deadlines, 0, id)
	if err != nil {
		h.t.Fatal(err)
	}
	return sc, ok
}

// run starts an engine with handler hd and returns the function that stops
// it and waits for Run to return.
func (h *harness) run(hd Handler, mod func(*Options)) (stop func()) {
	opts := Options{Replica: "a", Family: shard.Deadlines, LeaseTTL: time.Second, Rebalance: 100 * time.Millisecond,
		Poll: 10 * time.Millisecond}
	if mod != nil {
		mod(&opts)
	}
	e, err := New(opts, h.store, h.topo, hd, nil, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(h.ctx)
	errc := make(chan error, 1)
	go func() { errc <- e.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					h.t.Errorf("Run returned %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				h.t.Errorf("Run did not return within 10s of cancellation")
			}
		})
	}
	h.t.Cleanup(stop)
	return stop
}

// handler is a test Handler: fire decides each batch; revived records what
// Revived was told.
type handler struct {
	fire func(b Batch) ([]shard.Entry, []shard.Move, error)

	mu      sync.Mutex
	revived [][2]shard.Entry
}

func (h *handler) Fire(_ context.Context, b Batch) ([]shard.Entry, []shard.Move, error) {
	return h.fire(b)
}

func (h *handler) Fired(_ context.Context, ids []string) ([]int64, error) {
	return make([]int64, len(ids)), nil
}

func (h *handler) Revived(_ context.Context, fired, revived shard.Entry) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.revived = append(h.revived, [2]shard.Entry{fired, revived})
	return nil
}

// checkNoLeak fails if a goroutine of the engine is still running.
func checkNoLeak(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "sigwatch/shard/queue.(*Engine)") || strings.Contains(g, "sigwatch/shard/queue.parallel") ||
				strings.Contains(g, "sigwatch/shard/queue.(*watermark)") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d engine goroutines after Run returned, want 0:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHandlerSettlesWhatItHandled proves the settle of a batch: what the
// handler handled is removed, what it moved is re-scored, and it is called
// once for the batch.
func TestHandlerSettlesWhatItHandled(t *testing.T) {
	h := newHarness(t)
	due := time.Now().Add(-10 * time.Millisecond).UnixMilli()
	later := time.Now().Add(time.Hour).UnixMilli()
	h.add(shard.Entry{ID: "done", Deadline: due}, shard.Entry{ID: "again", Deadline: due})
	var calls atomic.Int32
	hd := &handler{fire: func(b Batch) ([]shard.Entry, []shard.Move, error) {
		calls.Add(1)
		var handled []shard.Entry
		var moves []shard.Move
		for _, e := range b.Due {
			if e.ID == "again" {
				moves = append(moves, shard.Move{ID: e.ID, From: e.Deadline, To: later})
			} else {
				handled = append(handled, e)
			}
		}
		return handled, moves, nil
	}}
	stop := h.run(hd, nil)
	testenv.WaitFor(t, 3*time.Second, "the batch to be settled", func() bool {
		_, present := h.score("done")
		sc, _ := h.score("again")
		return !present && sc == later
	})
	stop()
	checkNoLeak(t)
	if got := calls.Load(); got != 1 {
		t.Errorf("Fire called %d times, want 1", got)
	}
}

// TestUnhandledEntriesStayAndAreRetried proves that entries a handler
// neither handled nor moved, with or without an error, stay at their score
// (invariant 2) and are offered again.
func TestUnhandledEntriesStayAndAreRetried(t *testing.T) {
	h := newHarness(t)
	due := time.Now().Add(-10 * time.Millisecond).UnixMilli()
	h.add(shard.Entry{ID: "x", Deadline: due}, shard.Entry{ID: "y", Deadline: due})
	var calls atomic.Int32
	hd := &handler{fire: func(b Batch) ([]shard.Entry, []shard.Move, error) {
		switch calls.Add(1) {
		case 1:
			return nil, nil, errors.New("refused")
		case 2:
			return nil, nil, nil
		}
		return b.Due, nil, nil
	}}
	stop := h.run(hd, nil)
	testenv.WaitFor(t, 5*time.Second, "both entries handled on the third offer", func() bool {
		_, x := h.score("x")
		_, y := h.score("y")
		return !x && !y
	})
	stop()
	checkNoLeak(t)
	if got := calls.Load(); got != 3 {
		t.Errorf("Fire called %d times, want 3 (refused, left, handled)", got)
	}
}

// TestRevivedToldOfHandledEntries proves invariant 4 through the engine: a
// reset landing between the handler's Fire and the settle survives, and the
// handler is told of it with the score it fired and the new one.
func TestRevivedToldOfHandledEntries(t *testing.T) {
	h := newHarness(t)
	due := time.Now().Add(-10 * time.Millisecond).UnixMilli()
	reset := time.Now().Add(time.Hour).UnixMilli()
	h.add(shard.Entry{ID: "dev", Deadline: due})
	hd := &handler{fire: func(b Batch) ([]shard.Entry, []shard.Move, error) { return b.Due, nil, nil }}
	var resets atomic.Int32
	stop := h.run(hd, func(o *Options) {
		o.AfterFire = func(int) {
			if resets.Add(1) == 1 {
				h.add(shard.Entry{ID: "dev", Deadline: reset})
			}
		}
	})
	testenv.WaitFor(t, 3*time.Second, "Revived to be called", func() bool {
		hd.mu.Lock()
		defer hd.mu.Unlock()
		return len(hd.revived) > 0
	})
	stop()
	checkNoLeak(t)
	want := [2]shard.Entry{{ID: "dev", Deadline: due}, {ID: "dev", Deadline: reset}}
	if len(hd.revived) != 1 || hd.revived[0] != want {
		t.Errorf("Revived told %v, want [%v]", hd.revived, want)
	}
	if sc, ok := h.score("dev"); !ok || sc != reset {
		t.Errorf("got score %d (present %v), want the reset %d kept", sc, ok, reset)
	}
}
