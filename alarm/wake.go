package alarm

import "time"

// What the device's timer does to its state when it fires (the end of a
// hold, a repeat, the end of an ack or of flapping), and when it must fire
// next.

// wake handles a due timer: the end of a hold, a repeat, the end of an ack,
// the end of flapping. current is the device's current deadline (0: not
// watched), sm the storms over it; while one lasts a held alarm stays held
// and repeats are not sent. It reports whether st changed and, for a
// repeat, when it was due, and whether a storm held a notification back.
func (m machine) wake(st *State, current int64, sm storm) (changed bool, dueAt int64, held bool) {
	changed, dueAt, held = m.wakeHeld(st, current, sm)
	if changed || st.Held {
		return changed, dueAt, held
	}
	changed, dueAt = m.wakeActive(st, current, sm)
	return changed, dueAt, changed && sm.active && st.Phase == Active && dueAt > 0
}

// wakeHeld handles the timer of an alarm whose raise is held: it ends in
// silence if the device came back, stays held while a storm lasts, and is
// raised once the hold has passed since the loss and since the last storm
// ended.
func (m machine) wakeHeld(st *State, current int64, sm storm) (changed bool, dueAt int64, held bool) {
	if st.Phase != Active || !st.Held {
		return false, 0, false
	}
	switch {
	case current > st.Deadline:
		m.resolve(st, ReasonRecovered)
		st.Cleared = max(st.Cleared, st.Deadline)
		return true, 0, false
	case sm.active:
		first := !st.StormHeld
		st.StormHeld = true
		// The end of the storm wakes its devices; this is a fallback.
		st.Next = m.now + m.p.interval(1).Milliseconds()
		return true, 0, first
	}
	due := max(st.HeldAt, sm.quiet) + m.hold
	if due > m.now {
		if st.Next == due {
			return false, 0, false
		}
		st.Next = due
		return true, 0, false
	}
	if st.AckedUntil > m.now {
		st.Held, st.HeldAt, st.Next = false, 0, 0
		return true, 0, false
	}
	st.AckedUntil = 0
	m.raise(st, "")
	return true, 0, false
}

// wakeActive is wake for an alarm that is not held.
func (m machine) wakeActive(st *State, current int64, sm storm) (changed bool, dueAt int64) {
	back := current > st.Deadline
	switch st.Phase {
	case Damped:
		if st.StableAt > m.now {
			return false, 0
		}
		st.Losses, st.StableAt = nil, 0
		if back {
			m.resolve(st, ReasonStable)
			st.Cleared = max(st.Cleared, st.Deadline)
			return true, 0
		}
		// Stable, but down: from now on a normal alarm.
		st.Phase, st.Count = Active, 0
		st.Next = m.now + m.p.interval(1).Milliseconds()
		if st.AckedUntil <= m.now {
			st.AckedUntil = 0
			m.note(st, Raised, ReasonStable)
		}
		return true, 0
	case Active:
		if back {
			m.resolve(st, ReasonRecovered)
			st.Cleared = max(st.Cleared, st.Deadline)
			return true, 0
		}
		due := st.Next
		if st.AckedUntil > 0 {
			due = st.AckedUntil
		}
		if due == 0 || due > m.now {
			return false, 0
		}
		st.AckedUntil = 0
		if sm.active {
			// A storm over the device: its group's alarm speaks for it.
			st.Next = m.now + m.p.interval(st.Count+1).Milliseconds()
			return true, due
		}
		if m.p.MaxRepeats > 0 && st.Count >= m.p.MaxRepeats {
			m.resolve(st, ReasonExpired)
			return true, due
		}
		st.Count++
		m.note(st, Repeat, "")
		st.Next = m.now + m.p.interval(st.Count+1).Milliseconds()
		return true, due
	}
	return false, 0
}

// wake returns when the device's timer must fire next (0: never): the next
// repeat, the end of an ack or of flapping, and, while notifications are
// pending, the earliest send slot still to come or, for a note that could
// be published now, retry after retry.
func (st State) wake(now int64, retry time.Duration) int64 {
	var w int64
	switch st.Phase {
	case Active:
		w = st.Next
		// A held alarm wakes at the end of its hold even when acked.
		if st.AckedUntil > 0 && !st.Held {
			w = st.AckedUntil
		}
	case Damped:
		w = st.StableAt
	}
	for _, n := range st.Pending {
		r := now + retry.Milliseconds()
		if n.Slot > now {
			r = n.Slot
		}
		if w == 0 || r < w {
			w = r
		}
	}
	return w
}
