package stats

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestFleetSumsReportsAndStopsClean: two processes report what their own
// metrics counted; the stats sum them, a process stopped on purpose drops
// out at once (its report withdrawn), and Run leaves no goroutine behind.
func TestFleetSumsReportsAndStopsClean(t *testing.T) {
	before := testenv.IgnoreCurrent()
	env := testenv.New(t, testenv.Options{})
	store := env.Store(t, "sw")
	// The stats read the topology; the watcher creates it.
	if _, err := shard.NewWatcher(t.Context(), store, 4, time.Second, nil); err != nil {
		t.Fatal(err)
	}
	start := func(name string, roles []string, history bool, reg *prometheus.Registry) (*Fleet, func()) {
		f := New(Options{Name: name, Roles: roles, History: history, Store: store, Gatherer: reg, Now: time.Now,
			OutageAfter: time.Minute, Log: slog.New(slog.DiscardHandler)})
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := f.Run(ctx); err != nil {
				t.Errorf("%s: Run: %v", name, err)
			}
		})
		return f, func() { cancel(); wg.Wait() }
	}
	reg := prometheus.NewRegistry()
	signals := prometheus.NewCounter(prometheus.CounterOpts{Name: metricSignals})
	reg.MustRegister(signals)
	api, stopAPI := start("a", []string{"api"}, true, prometheus.NewRegistry())
	_, stopIngest := start("b", []string{"ingest"}, false, reg)
	testenv.WaitFor(t, 10*time.Second, "both processes in the stats", func() bool {
		v, err := api.Get(t.Context())
		return err == nil && len(v.Processes) == 2
	})
	signals.Add(100) // after b's first report, so its minute counts them
	testenv.WaitFor(t, 10*time.Second, "the 100 signals in the stats", func() bool {
		v, err := api.Get(t.Context())
		return err == nil && v.LastMinute.Signals == 100
	})
	stopIngest()
	testenv.WaitFor(t, 3*CacheFor, "the stopped process gone", func() bool {
		v, err := api.Get(t.Context())
		return err == nil && len(v.Processes) == 1 && v.Processes[0].Name == "a"
	})
	stopAPI()
	testenv.VerifyNone(t, before)
}
