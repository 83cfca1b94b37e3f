package timer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// model is what a timer is after the writes acknowledged so far.
type model struct {
	exists   bool
	deadline int64
	payload  string // "" for none
}

// apply is the timer API's contract for one reset or cancel.
func (m model) apply(op timerOp) model {
	if op.cancel {
		return model{}
	}
	next := model{exists: true, deadline: op.deadline}
	if m.exists && !op.set {
		next.deadline = max(m.deadline, op.deadline)
	}
	switch {
	case op.payload == "null":
	case op.payload != "":
		next.payload = op.payload
	case m.exists:
		next.payload = m.payload
	}
	return next
}

// timerOp is one write of the interleaving test.
type timerOp struct {
	cancel   bool
	set      bool
	deadline int64
	payload  string // a JSON value, "null" to remove it, "" to keep it
}

func (op timerOp) request() Request {
	r := Request{At: new(op.deadline)}
	if op.set {
		r.Mode = "set"
	}
	if op.payload != "" {
		r.Payload = json.RawMessage(op.payload)
	}
	return r
}

// TestTimersInterleavedWithDoublings writes 10,000 generic timers at random
// from two processes while the shards double 4 → 8 → 16: extends, sets to
// earlier or later deadlines, payload changes and removals, and cancels,
// each timer's writes one after another, from either process. Process b
// watches the topology only when a shard refuses it: it writes under a
// stale topology after each doubling until then, and stays on 8 shards
// through the second doubling, which therefore drains only when it is let
// go, after every timer fell due. Every timer then fired exactly once, at
// the deadline and with the payload its last acknowledged write left, never
// early, and a timer whose last write was a cancel never fired. The
// timers fall due after the writes, while the second doubling drains; a
// fires them all.
func TestTimersInterleavedWithDoublings(t *testing.T) {
	h := newHarness(t, 4)
	ctx := t.Context()
	mod := func(o *Options) { o.DrainCheck = 200 * time.Millisecond }
	a := h.service("a", mod)
	// b's watcher is stale until b reads the topology itself.
	staleTopo, err := shard.NewWatcher(ctx, h.store, 4, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	// b only writes: its engine would not know the new shards either.
	b, err := New(Options{Replica: "b", Config: Config{NATS: true}}, h.store, staleTopo, h.pub, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	bctx, stopB := context.WithCancel(context.Background())
	bdone := make(chan error, 1)
	go func() { bdone <- b.Run(bctx) }()
	t.Cleanup(func() {
		stopB()
		if err := <-bdone; err != nil {
			t.Errorf("timer service b: %v", err)
		}
	})

	const (
		timers   = 10_000
		workers  = 32
		writeFor = 6 * time.Second
	)
	start := time.Now()
	// Every write must be acknowledged before the first timer falls due:
	// a write racing its timer's fire could leave two events. A write
	// takes milliseconds, but a loaded machine (race detector, other test
	// binaries) stalls this process for a second at times: 3s of margin.
	fireFrom := start.Add(writeFor + 3*time.Second).UnixMilli()
	fireSpan := int64(5000)
	models := make([]model, timers)
	var mu sync.Mutex // guards models and lastAck
	var lastAck int64 // unix ms of the latest acknowledgement
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for time.Since(start) < writeFor {
				j := w + workers*rng.IntN(timers/workers)
				op := timerOp{deadline: fireFrom + rng.Int64N(fireSpan)}
				switch k := rng.IntN(10); {
				case k == 0:
					op.cancel = true
				case k <= 2:
					op.set = true
				}
				switch k := rng.IntN(4); k {
				case 0:
					op.payload = fmt.Sprintf(`{"t":%d,"w":%d}`, j, rng.IntN(1000))
				case 1:
					op.payload = "null"
				}
				// b writes during the first half only, and stays on the
				// topology it last read.
				s := a
				if time.Since(start) < writeFor/2 && rng.IntN(2) == 0 {
					s = b
				}
				id := fmt.Sprint("t-", j)
				var err error
				if op.cancel {
					_, err = s.Cancel(ctx, "q", id)
				} else {
					var tr shard.TimerReset
					if tr, err = s.Limits().Reset("q", id, op.request(), s.Now()); err == nil {
						err = s.Reset(ctx, []shard.TimerReset{tr})
					}
				}
				if err != nil {
					errs <- fmt.Errorf("timer %s: %+v: %w", id, op, err)
					return
				}
				mu.Lock()
				models[j] = models[j].apply(op)
				lastAck = max(lastAck, time.Now().UnixMilli())
				mu.Unlock()
			}
		})
	}
	// The doublings, while the writes go on.
	time.Sleep(time.Second)
	if _, err := h.store.Double(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the doubling to 8 drained", func() bool {
		top, err := h.store.Topology(ctx)
		return err == nil && top.Shards == 8 && !top.Draining()
	})
	if d := time.Until(start.Add(writeFor * 6 / 10)); d > 0 {
		time.Sleep(d)
	}
	if _, err := h.store.Double(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if margin := fireFrom - lastAck; margin <= 0 {
		t.Fatalf("the last write was acknowledged %dms after the first timer could fall due: the writes did not end before the fires", -margin)
	} else {
		t.Logf("the last write was acknowledged %dms before the first timer could fall due", margin)
	}
	if top, _ := h.store.Topology(ctx); !top.Draining() || staleTopo.Current().Shards != 8 {
		t.Fatalf("topology %+v, b on %d shards: want the doubling to 16 draining, b on 8", top, staleTopo.Current().Shards)
	}

	want := 0
	for _, m := range models {
		if m.exists {
			want++
		}
	}
	testenv.WaitFor(t, time.Until(time.UnixMilli(fireFrom+fireSpan))+30*time.Second, fmt.Sprintf("%d timers fired", want), func() bool {
		if time.Now().UnixMilli() > fireFrom+fireSpan+20_000 {
			t.Logf("%d of %d events so far", h.fired.Len(), want)
		}
		return h.fired.Len() >= want
	})
	if top, _ := h.store.Topology(ctx); !top.Draining() {
		t.Errorf("the doubling to 16 drained while b was still on 8 shards: the timers did not fall due during a drain")
	}
	// b reads the topology: the doubling drains.
	if _, err := staleTopo.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the doubling to 16 drained", func() bool {
		top, err := h.store.Topology(ctx)
		return err == nil && top.Shards == 16 && !top.Draining()
	})
	testenv.Never(t, time.Second, "more events than timers left standing", func() bool { return h.fired.Len() > want })

	got := map[int][]dispatch.Timer{}
	for _, ev := range h.fired.Events() {
		var j int
		if _, err := fmt.Sscanf(ev.Body.Timer, "t-%d", &j); err != nil || ev.Body.Queue != "q" {
			t.Fatalf("event of an unknown timer: %+v", ev.Body)
		}
		got[j] = append(got[j], ev.Body)
		if ev.Body.FiredAt < ev.Body.Deadline {
			t.Errorf("timer t-%d fired early: fired_at %d, deadline %d", j, ev.Body.FiredAt, ev.Body.Deadline)
		}
	}
	bad := 0
	for j, m := range models {
		evs := got[j]
		ok := len(evs) == 0 && !m.exists
		if m.exists && len(evs) == 1 {
			p := string(evs[0].Payload)
			ok = evs[0].Deadline == m.deadline && p == m.payload
		}
		if !ok {
			if bad++; bad <= 20 {
				t.Errorf("timer t-%d: its last acknowledged state is %+v, its events %+v", j, m, evs)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d timers did not fire as their last acknowledged write said", bad, timers)
	}
	t.Logf("%d timers, %d left standing fired once each at their last deadline with their last payload", timers, want)
}
