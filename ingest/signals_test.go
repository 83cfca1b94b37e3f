package ingest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// Signals stores a whole batch before it returns, clamps each entry's own
// time against the moment it is stamped, and refuses a batch with one bad
// entry without storing any of it.
func TestSignalsBatch(t *testing.T) {
	r := newRig(t, testenv.Options{})
	run := r.start(t, Options{MaxSkew: time.Minute})
	ctx := context.Background()

	bad := []Sig{{ID: "keep-out-1"}, {ID: "keep-out-2"}, {ID: "a\x00b"}}
	err := run.Signals(ctx, bad)
	var se *SignalError
	if !errors.As(err, &se) || se.Index != 2 || !errors.As(err, new(*InvalidError)) {
		t.Fatalf("Signals with a bad third entry = %v, want a SignalError at index 2 wrapping an InvalidError", err)
	}
	for _, s := range bad[:2] {
		if _, ok := r.deadline(t, s.ID); ok {
			t.Errorf("%s stored from a refused batch, want nothing stored", s.ID)
		}
	}

	const n = 3000
	before := time.Now()
	sigs := make([]Sig, n)
	for j := range sigs {
		sigs[j] = Sig{ID: fmt.Sprintf("b%04d", j)}
	}
	sigs[1].At = before.Add(-10 * time.Second) // kept
	sigs[2].At = before.Add(time.Hour)         // clamped to now
	sigs[3].At = before.Add(-time.Hour)        // clamped to now-MaxSkew
	sigs[4].Type = "pump"
	if err := run.Signals(ctx, sigs); err != nil {
		t.Fatalf("Signals of %d: %v", n, err)
	}
	after := time.Now()
	const thr = 30 * time.Second
	for _, j := range []int{0, n / 2, n - 1} {
		within(t, sigs[j].ID, mustDeadline(t, r, sigs[j].ID), before, after, thr)
	}
	if got, want := mustDeadline(t, r, "b0001"), before.Add(-10*time.Second+thr).UnixMilli(); got != want {
		t.Errorf("b0001 with its own time: deadline %d, want %d", got, want)
	}
	within(t, "b0002", mustDeadline(t, r, "b0002"), before, after, thr)
	within(t, "b0003", mustDeadline(t, r, "b0003"), before.Add(-time.Minute), after.Add(-time.Minute), thr)
	within(t, "b0004", mustDeadline(t, r, "b0004"), before, after, 90*time.Second)
}

// TestSignalsStampedInOrderWithBarriers proves the half of invariant 8 that
// the API path owns: in the order the collector receives work, every API
// signal behind a probe barrier of time T is stamped T or later, so a
// watermark of T never vouches for an API signal stamped before T that is
// not yet stored. Senders race barriers as the source and handlers do.
func TestSignalsStampedInOrderWithBarriers(t *testing.T) {
	r := newRig(t, testenv.Options{})
	// A clock that moves 1ms on every reading gives every stamp its own
	// time, so any barrier overtaking a stamped signal shows.
	var tick atomic.Int64
	base := time.Now()
	now := func() time.Time { return base.Add(time.Duration(tick.Add(1)) * time.Millisecond) }
	in, err := New(Options{Thresholds: r.thr, Now: now, MaxSkew: time.Hour}, r.store, r.topo, nil, nil, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	const senders, each = 4, 3000
	p := in.pipe
	// No collector runs: work holds everything, in the order handed over.
	p.work = make(chan signal, 1<<20)
	p.slots = make(chan struct{}, senders*each)
	done := make(chan error, senders*each)
	var wg, sending sync.WaitGroup
	stop := make(chan struct{})
	for g := range senders {
		sending.Go(func() {
			for j := range each {
				if err := p.enqueueStamped(context.Background(), Sig{ID: fmt.Sprintf("s%d-%d", g, j)}, done); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	// Barriers keep coming until every sender is done.
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				p.enqueueBarrier(in.opts.Now().UnixMilli())
				runtime.Gosched()
			}
		}
	})
	sending.Wait()
	close(stop)
	wg.Wait()
	close(p.work)
	var last int64
	var bad, n, bs int
	for s := range p.work {
		if s.probe != 0 {
			bs++
			last = max(last, s.probe)
			continue
		}
		n++
		if s.at < last {
			bad++
		}
	}
	if n != senders*each || bad != 0 {
		t.Errorf("got %d of %d signals stamped before a barrier queued ahead of them (of %d seen), want 0", bad, n, senders*each)
	}
	t.Logf("%d signals, %d barriers, %d signals behind a later barrier", n, bs, bad)
}
