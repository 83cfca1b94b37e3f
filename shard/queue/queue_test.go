package queue

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// The engine's own behaviour, with a test handler. The lost-event handler
// and the invariants seen through it (leases, take-over, fencing, the
// crossing rule, doublings) are proved in package scanner.

// harness is one test's Redis, store and topology of one shard.
type harness struct {
	t     *testing.T
	env   *testenv.Env
	ctx   context.Context
	store *shard.Store
	topo  *shard.Watcher
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	ctx := context.Background()
	env := testenv.New(t, testenv.Options{})
	store := env.Store(t, "sw")
	topo, err := shard.NewWatcher(ctx, store, 1, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Watermarks().Advance(ctx, time.Now().Add(time.Hour).UnixMilli(), time.Hour); err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, env: env, ctx: ctx, store: store, topo: topo}
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

// runUntil runs an engine with handler hd (options changed by mod) until
// cond holds, then stops it, waits for Run to return and checks that none
// of its goroutines is left.
func (h *harness) runUntil(hd Handler, mod func(*Options), what string, cond func() bool) {
	h.t.Helper()
	opts := Options{Replica: "a", Family: shard.Deadlines, Rebalance: 100 * time.Millisecond,
		Config: Config{LeaseTTL: time.Second, Poll: 10 * time.Millisecond}}
	if mod != nil {
		mod(&opts)
	}
	e, err := New(opts, h.store, h.topo, hd, nil, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	before := testenv.IgnoreCurrent()
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- e.Run(ctx) }()
	testenv.WaitFor(h.t, 5*time.Second, what, cond)
	cancel()
	if err := <-ran; err != nil {
		h.t.Errorf("Run returned %v, want nil", err)
	}
	testenv.VerifyNone(h.t, before)
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
	h.runUntil(hd, nil, "the batch to be settled", func() bool {
		_, present := h.score("done")
		sc, _ := h.score("again")
		return !present && sc == later
	})
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
	h.runUntil(hd, nil, "both entries handled on the third offer", func() bool {
		_, x := h.score("x")
		_, y := h.score("y")
		return !x && !y
	})
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
	afterFire := func(o *Options) {
		o.AfterFire = func(int) {
			if resets.Add(1) == 1 {
				h.add(shard.Entry{ID: "dev", Deadline: reset})
			}
		}
	}
	h.runUntil(hd, afterFire, "Revived to be called", func() bool {
		hd.mu.Lock()
		defer hd.mu.Unlock()
		return len(hd.revived) > 0
	})
	want := [2]shard.Entry{{ID: "dev", Deadline: due}, {ID: "dev", Deadline: reset}}
	if len(hd.revived) != 1 || hd.revived[0] != want {
		t.Errorf("Revived told %v, want [%v]", hd.revived, want)
	}
	if sc, ok := h.score("dev"); !ok || sc != reset {
		t.Errorf("got score %d (present %v), want the reset %d kept", sc, ok, reset)
	}
}
