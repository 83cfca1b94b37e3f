package sinks_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/sinks"
)

// These two wait out what they show (about 4.5 and 2 minutes): make test
// runs them beside the rest (SINKSLOW in the Makefile).

// TestSinkBudgetTwoPerSecond: 500 alarms queued for a sink with a budget of
// 2/s go out delayed, never dropped, each once, and no sliding second
// holds more than 2 of them.
func TestSinkBudgetTwoPerSecond(t *testing.T) {
	r := newRig(t)
	cfg, env, rc := webhookSink(t, "two", 2)
	const n = 500
	since := time.Now().UnixMilli()
	var evs []dispatch.Event
	for i := range n {
		evs = append(evs, note(fmt.Sprintf("dev-%03d", i), "raised", since, 0))
	}
	r.start(t, []sinks.Config{cfg}, env)
	r.publish(t, evs...)
	testenv.WaitFor(t, 6*time.Minute, "500 alarms delivered", func() bool { return len(rc.Deliveries()) >= n })
	if err := testenv.OverBudget(rc.Times(http.StatusNoContent), 2, time.Second); err != nil {
		t.Error(err)
	}
	if d := rc.Duplicates(); len(d) > 0 {
		t.Errorf("delivered twice: %v", d)
	}
	if got := len(rc.Deliveries()); got != n {
		t.Errorf("%d deliveries, want %d", got, n)
	}
}

// TestSinkReceiverDownAMinute: the receiver is down for 60 s while 300
// alarms are raised, repeated and resolved; once it is back every
// notification is delivered once, and each alarm's in the order it was
// published.
func TestSinkReceiverDownAMinute(t *testing.T) {
	r := newRig(t)
	cfg, env, rc := webhookSink(t, "patient", 0)
	cfg.RetryFor = 10 * time.Minute
	r.start(t, []sinks.Config{cfg}, env)
	rc.Down()
	since := time.Now().UnixMilli()
	order := map[string][]string{}
	var evs []dispatch.Event
	for i := range 300 {
		dev := fmt.Sprintf("dev-%03d", i)
		for _, a := range []dispatch.Alarm{note(dev, "raised", since, 0), note(dev, "repeat", since, 1), note(dev, "resolved", since, 1)} {
			evs = append(evs, a)
			order[dev] = append(order[dev], a.ID)
		}
	}
	r.publish(t, evs...)
	time.Sleep(60 * time.Second)
	rc.Up()
	testenv.WaitFor(t, 3*time.Minute, "900 notifications delivered", func() bool { return len(rc.Deliveries()) >= 900 })
	if d := rc.Duplicates(); len(d) > 0 {
		t.Errorf("delivered twice: %v", d)
	}
	pos := map[string]int{}
	for j, d := range rc.Deliveries() {
		pos[d.ID] = j
	}
	for dev, ids := range order {
		for k := 1; k < len(ids); k++ {
			if pos[ids[k]] < pos[ids[k-1]] {
				t.Fatalf("%s: %s delivered before %s", dev, ids[k], ids[k-1])
			}
		}
	}
}
