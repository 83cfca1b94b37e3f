package alarm

import (
	"testing"
	"time"
)

func TestIntervalBacksOffToTheCap(t *testing.T) {
	p := Policy{Interval: time.Minute, Backoff: 2, MaxInterval: 5 * time.Minute}
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	for k, w := range want {
		if got := p.interval(k + 1); got != w {
			t.Errorf("interval(%d) = %v, want %v", k+1, got, w)
		}
	}
}

// run applies steps to one device's state and returns the notes it made.
type step func(m machine, st *State)

func at(ms int64, p Policy, st *State, f step) {
	f(machine{p: p, id: "d", now: ms}, st)
}

func notes(st *State) []string {
	var out []string
	for _, n := range st.Pending {
		out = append(out, n.ID)
	}
	return out
}

// TestMachine walks the state machine through its transitions and checks
// the notification ids, which must be unique per transition.
func TestMachine(t *testing.T) {
	p := Policy{Interval: time.Second, Backoff: 1, MaxInterval: time.Second, MaxRepeats: 2,
		FlapCount: 2, FlapWindow: 5 * time.Second, FlapStable: 10 * time.Second}
	var st State
	lost := func(d, cur int64) step { return func(m machine, st *State) { m.lost(st, d, "t", cur) } }
	rec := func(d int64) step { return func(m machine, st *State) { m.recovered(st, d, "t") } }
	wake := func(cur int64) step { return func(m machine, st *State) { m.wake(st, cur, storm{}) } }

	at(1000, p, &st, lost(1000, 0))
	at(1000, p, &st, lost(1000, 0)) // delivered again: nothing
	at(2000, p, &st, wake(0))
	at(2500, p, &st, wake(0)) // not due
	at(3000, p, &st, wake(0))
	at(4000, p, &st, wake(0)) // max repeats: expired
	want := []string{"d@1000/raised/0", "d@1000/repeat/1", "d@1000/repeat/2", "d@1000/resolved/2"}
	if got := notes(&st); !equal(got, want) {
		t.Fatalf("raised, repeats, expired: got %v, want %v", got, want)
	}
	if st.Phase != Idle || st.Last != "resolved/expired" {
		t.Errorf("after expiry: phase %q last %q, want idle resolved/expired", st.Phase, st.Last)
	}

	// The recovery is handled before its loss: the loss raises nothing.
	st.Pending = nil
	at(9000, p, &st, rec(8000))
	at(9000, p, &st, lost(8000, 0))
	if len(st.Pending) != 0 || st.Phase != Idle {
		t.Errorf("loss after its recovery: notes %v phase %q, want none", notes(&st), st.Phase)
	}
	// A loss whose device has signalled since raises nothing.
	at(10000, p, &st, lost(9500, 12000))
	if len(st.Pending) != 0 || st.Phase != Idle {
		t.Errorf("loss of a device back since: notes %v phase %q, want none", notes(&st), st.Phase)
	}
	// That was the third loss within the window: the next one flaps.
	at(11000, p, &st, lost(11000, 0))
	at(11500, p, &st, rec(11000))
	at(12000, p, &st, lost(12000, 0))
	at(15000, p, &st, wake(0)) // not stable yet
	want = []string{"d@11000/flapping/0"}
	if got := notes(&st); !equal(got, want) {
		t.Fatalf("flapping: got %v, want %v", got, want)
	}
	// Stable and down: a normal alarm from then on.
	at(22000, p, &st, wake(0))
	at(23000, p, &st, wake(0))
	at(23500, p, &st, rec(12000))
	want = append(want, "d@11000/raised/0", "d@11000/repeat/1", "d@11000/resolved/1")
	if got := notes(&st); !equal(got, want) {
		t.Fatalf("flapping then down: got %v, want %v", got, want)
	}

	// Ack until pauses, says so once, and the repeat after it continues
	// the count; a second ack at the same count while the first is pending
	// adds nothing.
	st = State{}
	at(1000, p, &st, lost(1000, 0))
	at(1500, p, &st, func(m machine, st *State) { m.ack(st, 5000, "") })
	at(1600, p, &st, func(m machine, st *State) { m.ack(st, 4000, "") })
	if st.AckedUntil != 4000 || st.Last != Acked {
		t.Fatalf("second ack: acked until %d last %q, want 4000 acked", st.AckedUntil, st.Last)
	}
	at(2000, p, &st, wake(0))
	at(4000, p, &st, wake(0))
	at(5100, p, &st, func(m machine, st *State) { m.ack(st, 0, "") })
	want = []string{"d@1000/raised/0", "d@1000/acked/0", "d@1000/repeat/1", "d@1000/resolved/1"}
	if got := notes(&st); !equal(got, want) || st.Last != "resolved/acked" {
		t.Fatalf("ack until, then ack: got %v last %q, want %v resolved/acked", got, st.Last, want)
	}
	if a := st.Pending[1]; a.State != Acked || a.Count != 0 || a.Since != 1000 || a.At != 1500 || a.Device != "d" {
		t.Errorf("acked note %+v, want state acked, count 0, since 1000, at 1500, device d", a.Alarm)
	}
	if (machine{p: p, id: "d", now: 6000}).ack(&st, 0, "") {
		t.Error("ack of a resolved alarm succeeded, want refused")
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for j := range a {
		if a[j] != b[j] {
			return false
		}
	}
	return true
}

// TestMachineHold walks a held alarm: silent while the hold runs, raised
// after it; held through a storm and raised a hold after the storm ends;
// resolved without a word when the device comes back while held; repeats
// skipped while a storm lasts.
func TestMachineHold(t *testing.T) {
	p := Policy{Interval: time.Second, Backoff: 1, MaxInterval: time.Second}
	hold := func(ms int64, f func(m machine, st *State)) func(st *State) {
		return func(st *State) { f(machine{p: p, id: "d", now: ms, hold: 500}, st) }
	}
	calm, stormy := storm{}, storm{active: true}

	var st State
	hold(1000, func(m machine, st *State) { m.lost(st, 1000, "t", 0) })(&st)
	if !st.Held || st.Next != 1500 || len(st.Pending) != 0 {
		t.Fatalf("after the loss: %+v, want held until 1500 without a note", st)
	}
	hold(1200, func(m machine, st *State) { m.wake(st, 0, calm) })(&st)
	if len(st.Pending) != 0 {
		t.Fatalf("raised during the hold: %v", notes(&st))
	}
	hold(1500, func(m machine, st *State) { m.wake(st, 0, calm) })(&st)
	if got := notes(&st); !equal(got, []string{"d@1000/raised/0"}) || st.Held {
		t.Fatalf("after the hold: %v held=%v, want raised", got, st.Held)
	}
	// A repeat due during a storm is skipped.
	st.Pending = nil
	var held bool
	hold(2500, func(m machine, st *State) { _, _, held = m.wake(st, 0, stormy) })(&st)
	if len(st.Pending) != 0 || !held || st.Count != 0 || st.Next != 3500 {
		t.Fatalf("repeat during a storm: %v held=%v %+v, want none, held, next at 3500", notes(&st), held, st)
	}

	// Held through a storm, raised a hold after its end.
	var s2 State
	hold(1000, func(m machine, st *State) { m.lost(st, 1000, "t", 0) })(&s2)
	hold(1500, func(m machine, st *State) { _, _, held = m.wake(st, 0, stormy) })(&s2)
	if len(s2.Pending) != 0 || !s2.Held || !held {
		t.Fatalf("in a storm: %v %+v, want held", notes(&s2), s2)
	}
	ended := storm{quiet: 4000}
	hold(4200, func(m machine, st *State) { m.wake(st, 0, ended) })(&s2)
	if len(s2.Pending) != 0 || s2.Next != 4500 {
		t.Fatalf("just after the storm: %v next %d, want nothing until 4500", notes(&s2), s2.Next)
	}
	hold(4500, func(m machine, st *State) { m.wake(st, 0, ended) })(&s2)
	if got := notes(&s2); !equal(got, []string{"d@1000/raised/0"}) {
		t.Fatalf("a hold after the storm: %v, want raised", got)
	}

	// Acked while held: the hold still ends on time, in silence, and the
	// alarm stays acked until the ack ends.
	var s4 State
	hold(1000, func(m machine, st *State) { m.lost(st, 1000, "t", 0) })(&s4)
	hold(1100, func(m machine, st *State) { m.ack(st, 60_000, "") })(&s4)
	if w := s4.wake(1100, time.Second); w != 1500 || len(s4.Pending) != 0 {
		t.Fatalf("acked while held: wakes at %d with notes %v, want the end of the hold (1500) and no acked: nobody heard of it", w, notes(&s4))
	}
	if l, _ := listed("d", s4, nil, 1100); l.State != ListAcked {
		t.Fatalf("acked while held: listed %q, want %q as the device's view says", l.State, ListAcked)
	}
	hold(1500, func(m machine, st *State) { m.wake(st, 0, calm) })(&s4)
	if len(s4.Pending) != 0 || s4.Held || s4.AckedUntil != 60_000 || s4.wake(1500, time.Second) != 60_000 {
		t.Fatalf("acked, after the hold: %v %+v, want unheld in silence, acked until 60000", notes(&s4), s4)
	}

	// Back while held: resolved in silence, and a late lost event for the
	// same loss raises nothing.
	var s3 State
	hold(1000, func(m machine, st *State) { m.lost(st, 1000, "t", 0) })(&s3)
	hold(1300, func(m machine, st *State) { m.recovered(st, 1000, "t") })(&s3)
	hold(1400, func(m machine, st *State) { m.lost(st, 1000, "t", 0) })(&s3)
	hold(2000, func(m machine, st *State) { m.wake(st, 0, calm) })(&s3)
	if len(s3.Pending) != 0 || s3.Phase != Idle {
		t.Fatalf("back while held: %v %+v, want idle without a note", notes(&s3), s3)
	}
}
