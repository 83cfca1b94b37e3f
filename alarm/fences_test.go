package alarm

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sigwatch/sigwatch/dispatch"
)

// TestLapsingFenceKeepsNotifyRate measures the raised notifications per
// second the event path makes for fresh devices, unfenced (as before
// lapsing fences: a core bus's fences are the zero Fence) and under the
// process's lapsing fences, in alternating rounds on the same Redis and
// NATS: the fence must not cost a healthy replica its rate.
func TestLapsingFenceKeepsNotifyRate(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, err := New(Options{Policy: DefaultPolicy, AckWait: 2 * time.Second}, h.store, h.topo, h.timers, h.rtopo, h.pub, nil, h.log)
	if err != nil {
		t.Fatal(err)
	}
	core, err := dispatch.New(ctx, h.nc, dispatch.Options{Mode: dispatch.Core})
	if err != nil {
		t.Fatal(err)
	}
	fenced := h.pub.Lapsing(notesScope, "bench", a.opts.Workers)
	if f, err := fenced.Take(ctx); err != nil || f.Subject == "" {
		t.Fatalf("lapsing fence: %+v, %v; want one", f, err)
	}
	const n = 2000
	round := 0
	rate := func(notes *dispatch.Lapsing) float64 {
		round++
		a.notes = notes
		deadline := time.Now().Add(-time.Second).UnixMilli()
		var g errgroup.Group
		g.SetLimit(a.opts.Workers)
		start := time.Now()
		for k := range n {
			id := fmt.Sprintf("r%d-%04d", round, k)
			g.Go(func() error {
				return events{a}.Lost(ctx, dispatch.Lost{ID: dispatch.LostID(id, deadline), Device: id, Type: "meter", Deadline: deadline})
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		return n / time.Since(start).Seconds()
	}
	var before, after float64
	for range 3 {
		before = max(before, rate(core.Lapsing(notesScope, "bench", a.opts.Workers)))
		after = max(after, rate(fenced))
	}
	h.notes.WaitN(t, 10*time.Second, 6*n, "every raised notification", nil)
	t.Logf("raised notifications/s, best of 3 rounds of %d: unfenced %.0f, fenced %.0f (%.0f%%)", n, before, after, 100*after/before)
	if after < before/2 {
		t.Errorf("fenced rate %.0f/s is less than half the unfenced %.0f/s", after, before)
	}
}
