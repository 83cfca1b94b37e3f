package guard_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/guard"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestRestoreLongerThanLockKeepsOneRestorer: two processes see Redis come
// back empty; the restore of 48 alarm states, 500 ms each, lasts about
// four times the restore lock's TTL, and still one process restores, each alarm
// once, with one redis_data_loss and one redis_restored event.
func TestRestoreLongerThanLockKeepsOneRestorer(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	system := testenv.RecordStream[dispatch.System](t, r.env.Conn(t), "SIGWATCH", "sigwatch.system")
	const n, each, ttl = 48, 500 * time.Millisecond, 400 * time.Millisecond
	var recs []dispatch.DeviceRecord
	for i := range n {
		recs = append(recs, dispatch.DeviceRecord{ID: fmt.Sprintf("dev-%02d", i), Alarm: fmt.Sprintf(`{"v":%d}`, i+1)})
	}
	r.add(t, recs)
	var mu sync.Mutex
	by := map[string][]int{} // id -> the processes that restored it
	var stops []func()
	var gs []*guard.Guard
	for p := range 2 {
		store := r.store
		if p > 0 {
			store = r.env.Store(t, "sw")
		}
		g := guard.New(guard.Options{Store: store, Registry: r.reg, Pub: r.pub, Thresholds: r.thr, Initial: 4,
			RestoreLockTTL: ttl, Registerer: prometheus.NewRegistry(), Log: slog.New(slog.DiscardHandler),
			RestoreAlarm: func(ctx context.Context, id, raw string) error {
				time.Sleep(each)
				mu.Lock()
				by[id] = append(by[id], p)
				mu.Unlock()
				return nil
			}})
		if err := g.Establish(ctx); err != nil {
			t.Fatal(err)
		}
		stops = append(stops, runOn(t, store, g))
		gs = append(gs, g)
	}
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	r.empty(t)
	start := time.Now()
	testenv.WaitFor(t, 30*time.Second, "both ready after the restore", func() bool {
		mu.Lock()
		done := len(by) == n
		mu.Unlock()
		a, _ := gs[0].Ready()
		b, _ := gs[1].Ready()
		return done && a && b
	})
	t.Logf("restore of %d alarms took %v with a %v lock", n, time.Since(start), ttl)
	time.Sleep(2 * ttl) // a second restorer would start within this
	mu.Lock()
	first := by[recs[0].ID]
	for _, rec := range recs {
		if got := by[rec.ID]; len(got) != 1 || got[0] != first[0] {
			t.Errorf("alarm of %s restored by processes %v, want once by process %v", rec.ID, got, first)
		}
	}
	mu.Unlock()
	time.Sleep(500 * time.Millisecond)
	for _, kind := range []string{"redis_data_loss", "redis_restored"} {
		if got := system.Bodies(func(ev dispatch.System) bool { return ev.Kind == kind }); len(got) != 1 {
			t.Errorf("%d %s events, want 1", len(got), kind)
		}
	}
}

// runOn runs g with a topology watcher on store until the returned stop is
// called.
func runOn(t *testing.T, store *shard.Store, g *guard.Guard) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	w, err := shard.NewWatcher(ctx, store, 4, 50*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.Watch(w, nil)
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	return func() { cancel(); <-done }
}
