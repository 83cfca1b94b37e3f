package timer

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestDoublingCarriesLongTimersAndFiresEachOnce doubles the shards while
// timers fall due and others are days away: the due ones fire exactly once
// at their last deadline (some reset across the doubling), and the far
// ones are carried to their new shard with their payloads, so the
// doubling drains in seconds instead of waiting for them.
func TestDoublingCarriesLongTimersAndFiresEachOnce(t *testing.T) {
	h := newHarness(t, 4)
	mod := func(o *Options) { o.DrainCheck = 200 * time.Millisecond }
	a, b := h.service("a", mod), h.service("b", mod)
	ctx := t.Context()
	var near, far []shard.TimerReset
	now := a.Now()
	for j := range 2000 {
		tr, err := a.Limits().Reset(fmt.Sprint("q", j%5), fmt.Sprint("n-", j),
			Request{At: new(now.Add(time.Second + time.Duration(j)*time.Millisecond).UnixMilli())}, now)
		if err != nil {
			t.Fatal(err)
		}
		near = append(near, tr)
		tr, err = a.Limits().Reset("far", fmt.Sprint("f-", j), Request{After: after(72 * time.Hour),
			Payload: json.RawMessage(fmt.Sprintf(`{"f":%d}`, j))}, now)
		if err != nil {
			t.Fatal(err)
		}
		far = append(far, tr)
	}
	if err := a.Reset(ctx, append(append([]shard.TimerReset(nil), near...), far...)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.Double(ctx, a.Now()); err != nil {
		t.Fatal(err)
	}
	// Half the near timers are reset later through the other process while
	// the doubling drains.
	testenv.WaitFor(t, 5*time.Second, "b sees the doubling", func() bool { return h.topo.Current().Shards == 8 })
	last := map[string]int64{}
	for _, tr := range near {
		last[tr.Member] = tr.Deadline
	}
	var again []shard.TimerReset
	for j := 1000; j < 2000; j += 2 {
		tr := near[j]
		tr.Deadline += 1500
		again = append(again, tr)
		last[tr.Member] = tr.Deadline
	}
	if err := b.Reset(ctx, again); err != nil {
		t.Fatal(err)
	}
	h.fired.WaitN(t, 30*time.Second, len(near), "every near timer fired", func(dispatch.Timer) bool { return true })
	testenv.WaitFor(t, 30*time.Second, "the doubling drained", func() bool {
		top, err := h.store.Topology(ctx)
		return err == nil && !top.Draining()
	})
	testenv.Never(t, time.Second, "more events", func() bool { return h.fired.Len() > len(near) })
	seen := map[string]int{}
	for _, ev := range h.fired.Events() {
		m := shard.TimerMember(ev.Body.Queue, ev.Body.Timer)
		seen[m]++
		if ev.Body.Deadline != last[m] {
			t.Errorf("%s fired at %d, its last deadline is %d", m, ev.Body.Deadline, last[m])
		}
		if ev.Body.FiredAt < ev.Body.Deadline {
			t.Errorf("%s fired early: %d < %d", m, ev.Body.FiredAt, ev.Body.Deadline)
		}
	}
	for m, n := range seen {
		if n != 1 {
			t.Errorf("%s fired %d times", m, n)
		}
	}
	for j, tr := range far {
		got, ok, err := a.Get(ctx, "far", fmt.Sprint("f-", j))
		if err != nil || !ok || got.Deadline != tr.Deadline || string(got.Payload) != fmt.Sprintf(`{"f":%d}`, j) {
			t.Fatalf("far timer %d after the doubling: %+v %v %v", j, got, ok, err)
		}
	}
	for i := range 4 {
		if moved, err := h.store.CountMoved(ctx, i, 8, false); err != nil || moved != 0 {
			t.Fatalf("shard %d holds %d moved members (%v)", i, moved, err)
		}
	}
}

// TestPayloadChangeWhileFiringIsNotLost proves that a reset changing the
// payload of a timer that is being fired — claimed due, its payload read,
// its event not yet out — is not lost: the event that was going out keeps
// the payload it had, and the timer fires once more, a millisecond later,
// with the new one; nothing is left stored. (The settle compared only the
// deadline, removed the timer with its new payload, and no event ever
// carried it.)
func TestPayloadChangeWhileFiringIsNotLost(t *testing.T) {
	h := newHarness(t, 2)
	reading, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s := h.service("a", func(o *Options) {
		o.firing = func() { once.Do(func() { close(reading); <-release }) }
	})
	tr := mustReset(t, s, "q", "p", Request{After: after(200 * time.Millisecond), Payload: json.RawMessage(`"old"`)})
	<-reading
	// The same deadline, a new payload: only the payload changes.
	mustReset(t, s, "q", "p", Request{At: new(tr.Deadline), Payload: json.RawMessage(`"new"`)})
	close(release)
	evs := h.fired.WaitN(t, 5*time.Second, 2, "both events", func(dispatch.Timer) bool { return true })
	if a, b := evs[0].Body, evs[1].Body; string(a.Payload) != `"old"` || a.Deadline != tr.Deadline ||
		string(b.Payload) != `"new"` || b.Deadline != tr.Deadline+1 {
		t.Errorf("events %+v then %+v; want the old payload at %d, then the new one at %d", a, b, tr.Deadline, tr.Deadline+1)
	}
	testenv.Never(t, time.Second, "a third event", func() bool { return h.fired.Len() > 2 })
	if _, ok, _ := s.Get(t.Context(), "q", "p"); ok {
		t.Error("the timer is still stored after firing with its last payload")
	}
}
