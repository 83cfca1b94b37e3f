package alarm

import (
	"slices"
	"testing"
	"time"
)

// TestMachineCoalescesWaitingRepeats: a repeat replaces a repeat of the
// same alarm that waits for its send slot, taking that slot; a raised, a
// repeat not yet given a slot (no rate limits) and a repeat of an earlier
// alarm are kept.
func TestMachineCoalescesWaitingRepeats(t *testing.T) {
	p := Policy{Interval: time.Second, Backoff: 1, MaxInterval: time.Second}
	m := machine{p: p, id: "d", now: 1000}
	st := State{Phase: Active, Type: "t", Since: 500, Deadline: 500, Next: 1000}
	m.note(&st, Raised, "")
	st.Pending[0].Slot = 9000
	st.Count = 1
	m.note(&st, Repeat, "")
	st.Pending[1].Slot = 9100
	for k := 2; k <= 4; k++ {
		st.Count = k
		m.note(&st, Repeat, "")
	}
	got := []string{}
	for _, n := range st.Pending {
		got = append(got, n.ID)
	}
	if want := []string{NoteID("d", 500, Raised, 0), NoteID("d", 500, Repeat, 4)}; !slices.Equal(got, want) {
		t.Errorf("pending %v, want %v", got, want)
	}
	if s := st.Pending[1].Slot; s != 9100 {
		t.Errorf("coalesced repeat has slot %d, want the first one's 9100", s)
	}

	// Without a slot (unlimited, or a note whose publish failed before the
	// limits applied) nothing is coalesced.
	un := State{Phase: Active, Type: "t", Since: 500}
	for k := 1; k <= 3; k++ {
		un.Count = k
		m.note(&un, Repeat, "")
	}
	if len(un.Pending) != 3 {
		t.Errorf("unlimited: %d pending, want 3", len(un.Pending))
	}

	// A repeat of an earlier alarm (another since) stays.
	old := State{Phase: Active, Type: "t", Since: 500, Count: 3}
	m.note(&old, Repeat, "")
	old.Pending[0].Slot = 9000
	old.Since, old.Count = 700, 1
	m.note(&old, Repeat, "")
	if len(old.Pending) != 2 {
		t.Errorf("repeats of two alarms: %d pending, want 2", len(old.Pending))
	}
}

// TestWakeAtSlot: a note waiting for its slot wakes the device at the slot;
// one due, or without a slot, is retried after retry; the earliest of
// these and the next repeat wins.
func TestWakeAtSlot(t *testing.T) {
	const now = 10_000
	retry := 2 * time.Second
	cases := []struct {
		name  string
		next  int64
		slots []int64
		want  int64
	}{
		{"slot later than retry", 60_000, []int64{15_000}, 15_000},
		{"slot before retry", 60_000, []int64{10_100}, 10_100},
		{"earliest of two slots", 60_000, []int64{14_000, 13_000}, 13_000},
		{"due slot retried", 60_000, []int64{9_000, 15_000}, now + 2000},
		{"no slot retried", 60_000, []int64{0}, now + 2000},
		{"next repeat first", 11_000, []int64{15_000}, 11_000},
	}
	for _, c := range cases {
		st := State{Phase: Active, Next: c.next}
		for _, s := range c.slots {
			st.Pending = append(st.Pending, Note{Slot: s})
		}
		if got := st.wake(now, retry); got != c.want {
			t.Errorf("%s: wake = %d, want %d", c.name, got, c.want)
		}
	}
}

// TestEmission: the interval between notifications is a tenth wider than
// 1/rate, rounded up to a whole millisecond, so the rate is never exceeded
// (config refuses rates above 1000/s).
func TestEmission(t *testing.T) {
	for _, c := range []struct {
		rate float64
		want time.Duration
	}{{0, 0}, {10, 110 * time.Millisecond}, {3, 367 * time.Millisecond}, {0.5, 2200 * time.Millisecond}, {5000, 2 * time.Millisecond}} {
		if got := emission(c.rate); got != c.want {
			t.Errorf("emission(%v) = %v, want %v", c.rate, got, c.want)
		}
	}
}
