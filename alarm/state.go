package alarm

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
)

// Notification states, the "state" of a message on sigwatch.alarm.<type>.
const (
	Raised = "raised"
	// Acked: an ack with an end paused the repeats (sent once per ack at
	// a count; the View state of such an alarm too).
	Acked = "acked"
	// Held is the View state of an alarm whose raise waits for the storm
	// hold or a storm; it is never a notification.
	Held     = "held"
	Repeat   = "repeat"
	Flapping = "flapping"
	Resolved = "resolved"
)

// Reasons of a resolved notification, and of the raised that ends a
// flapping alarm whose device stayed down.
const (
	ReasonRecovered = "recovered" // the device signalled again
	ReasonAcked     = "acked"     // acknowledged without an end
	ReasonRemoved   = "removed"   // the device was deleted through the API
	ReasonExpired   = "expired"   // max repeats reached
	ReasonStable    = "stable"    // a flapping device stopped flapping
)

// Phase is where a device's alarm stands.
type Phase string

const (
	// Idle: no alarm (never raised, or resolved).
	Idle Phase = ""
	// Active: raised and repeating, or paused by an ack with an end.
	Active Phase = "active"
	// Damped: flapping; silent until the device is stable.
	Damped Phase = "flapping"
)

// Note is a notification decided by a transition and not yet published.
// Muted notes are decided as muted inside the transition, so every replica
// that flushes it agrees, and are dropped instead of published.
type Note struct {
	dispatch.Alarm
	Muted bool `json:"muted,omitempty"`
	// Slot is the send slot the rate limits gave the note (unix ms; 0: none
	// yet, or unlimited): it is published at or after it (see rate.go).
	Slot int64 `json:"slot,omitempty"`
}

// State is a device's alarm as stored in Redis (JSON, one HASH field per
// device in its registry partition). Every change is a compare-and-set of
// the whole value, and Version grows with each, so two workers racing on a
// device make exactly one transition.
type State struct {
	Version int64  `json:"v"`
	Phase   Phase  `json:"phase,omitempty"`
	Type    string `json:"type,omitempty"`
	// Since is the deadline the device was lost at when the alarm started:
	// the alarm's identity in notification ids.
	Since int64 `json:"since,omitempty"`
	// Deadline is the latest deadline the device was lost at (of this alarm
	// or, when Idle, of the last one); lost events at or before it are old.
	Deadline int64 `json:"deadline,omitempty"`
	// Cleared: lost events at or before it raise nothing (their recovery,
	// or the device's removal, was already handled).
	Cleared int64 `json:"cleared,omitempty"`
	Count   int   `json:"count,omitempty"` // repeats sent
	Next    int64 `json:"next,omitempty"`  // next repeat (Active), unix ms
	// AckedUntil pauses repeats of an Active alarm until then; they resume
	// if the device is still silent.
	AckedUntil int64 `json:"acked_until,omitempty"`
	// AckedBy is who last acked the alarm (the API caller's name); a new
	// alarm starts without it.
	AckedBy string `json:"acked_by,omitempty"`
	// StableAt ends a Damped alarm unless the device goes lost or recovers
	// again before.
	StableAt int64 `json:"stable_at,omitempty"`
	// Losses are the recent deadlines the device was lost at, for flap
	// damping.
	Losses []int64 `json:"losses,omitempty"`
	// Last is the last notification state (and reason), At its time.
	Last    string `json:"last,omitempty"`
	At      int64  `json:"at,omitempty"`
	Pending []Note `json:"pending,omitempty"`
	// Group is the device's group, from its latest lost event.
	Group string `json:"group,omitempty"`
	// LastSeen is when the device was last heard of before the loss that
	// started the alarm (0: not known).
	LastSeen int64 `json:"last_seen,omitempty"`
	// Held: the alarm is Active but its raise is not sent yet; it waits
	// out the storm hold from HeldAt (and, while a storm of its group or
	// the fleet lasts, the storm). StormHeld says a storm held it.
	Held      bool  `json:"held,omitempty"`
	HeldAt    int64 `json:"held_at,omitempty"`
	StormHeld bool  `json:"storm_held,omitempty"`
}

// Policy is the alarm's timing: repeat intervals and flap damping.
type Policy struct {
	Interval    time.Duration `yaml:"interval"`     // before the first repeat
	Backoff     float64       `yaml:"backoff"`      // each next interval is this times the last (>= 1)
	MaxInterval time.Duration `yaml:"max_interval"` // cap of the backoff
	MaxRepeats  int           `yaml:"max_repeats"`  // 0: unlimited; else resolved/expired after that many
	FlapCount   int           `yaml:"flap_count"`   // more lost/recovered cycles than this in FlapWindow: flapping (0: off)
	FlapWindow  time.Duration `yaml:"flap_window"`
	FlapStable  time.Duration `yaml:"flap_stable"` // a flapping device stable this long ends flapping
}

// interval is the wait before repeat k (k >= 1).
func (p Policy) interval(k int) time.Duration {
	d := float64(p.Interval)
	if p.Backoff > 1 && k > 1 {
		d *= math.Pow(p.Backoff, float64(k-1))
	}
	if p.MaxInterval > 0 && d > float64(p.MaxInterval) {
		return p.MaxInterval
	}
	return time.Duration(d)
}

// NoteID is the de-duplication id of a notification:
// <device>@<alarm start>/<state>/<count>. One alarm makes each (state,
// count) at most once, so the id is unique per transition and the same
// whichever replica publishes it.
func NoteID(device string, since int64, state string, count int) string {
	return dispatch.LostID(device, since) + "/" + state + "/" + strconv.Itoa(count)
}

// machine applies events to one device's State. Its methods are pure: the
// facts they need (the device's current deadline, the time) are passed in.
type machine struct {
	p   Policy
	id  string
	now int64
	// hold is how long a new alarm waits before it is raised, to see
	// whether a storm takes it in (0: raised at once).
	hold int64
	// group names a group alarm's group in its notes.
	group string
	// lastSeen is when the device was last heard of, from the lost event
	// being handled (0: not known).
	lastSeen int64
}

// storm is what a wake knows of the storms over a device: whether one of
// its group or of the fleet lasts now, and when the last of them ended.
type storm struct {
	active bool
	quiet  int64
}

func (m machine) note(st *State, state, reason string) {
	device := m.id
	if _, ok := scopeOf(m.id); ok {
		device = "" // a group's or the fleet's alarm
	}
	n := Note{Alarm: dispatch.Alarm{
		ID: NoteID(m.id, st.Since, state, st.Count), Device: device, Type: st.Type,
		State: state, Reason: reason, Count: st.Count, Since: st.Since, At: m.now,
		Group: cmp.Or(m.group, st.Group), LastSeen: st.LastSeen,
	}}
	if state == Repeat {
		// A repeat of this alarm still waiting for its send slot is replaced
		// by this one, which takes its slot: one repeat goes out, with the
		// latest count.
		j := slices.IndexFunc(st.Pending, func(p Note) bool {
			return p.State == Repeat && p.Since == st.Since && p.Slot > 0
		})
		if j >= 0 {
			n.Slot = st.Pending[j].Slot
			st.Pending = slices.Delete(st.Pending, j, j+1)
		}
	}
	st.Pending = append(st.Pending, n)
	st.Last = state
	if reason != "" {
		st.Last += "/" + reason
	}
}

// resolve ends the alarm with reason; an alarm whose raise was held ends
// without a word, since nobody heard of it.
func (m machine) resolve(st *State, reason string) {
	if !st.Held {
		m.note(st, Resolved, reason)
	}
	st.Phase, st.Next, st.AckedUntil, st.StableAt = Idle, 0, 0, 0
	st.Held, st.HeldAt, st.StormHeld = false, 0, false
}

// raise sends the raise of an Active alarm and starts its repeats.
func (m machine) raise(st *State, reason string) {
	st.Held, st.HeldAt = false, 0
	st.Next = m.now + m.p.interval(1).Milliseconds()
	m.note(st, Raised, reason)
}

// loss records a newly seen loss at deadline d and reports whether the
// device now flaps.
func (m machine) loss(st *State, d int64) bool {
	from := m.now - m.p.FlapWindow.Milliseconds()
	st.Losses = slices.DeleteFunc(st.Losses, func(x int64) bool { return x < from })
	if !slices.Contains(st.Losses, d) {
		st.Losses = append(st.Losses, d)
		slices.Sort(st.Losses)
	}
	if m.p.FlapCount <= 0 {
		st.Losses = nil
		return false
	}
	if len(st.Losses) > m.p.FlapCount+1 {
		st.Losses = st.Losses[len(st.Losses)-m.p.FlapCount-1:]
	}
	return len(st.Losses) > m.p.FlapCount
}

// damp starts a flapping alarm (or turns an idle device into one) at d.
func (m machine) damp(st *State, d int64) {
	st.Phase, st.Since, st.Count, st.Next, st.AckedUntil, st.AckedBy = Damped, d, 0, 0, 0, ""
	st.StableAt = m.now + m.p.FlapStable.Milliseconds()
	m.note(st, Flapping, "")
}

// lost handles a lost event for deadline d of a device of type typ whose
// current deadline is current (0: not watched); a current deadline after d
// says the device has signalled since. It reports whether st changed.
func (m machine) lost(st *State, d int64, typ string, current int64) bool {
	if d <= st.Cleared || d <= st.Deadline {
		return false // seen already, or its recovery or removal was
	}
	back := current > d
	if typ != "" {
		st.Type = typ
	}
	if st.Phase == Active {
		// An alarm for an earlier loss is still open: the device came back
		// in between (its recovered event is late or was lost).
		m.resolve(st, ReasonRecovered)
	}
	flaps := m.loss(st, d)
	st.Deadline = d
	if back {
		st.Cleared = d
	}
	switch {
	case st.Phase == Damped:
		st.StableAt = m.now + m.p.FlapStable.Milliseconds()
	case flaps:
		m.damp(st, d)
	case back:
		// Signalled again before the event was handled: nothing to raise.
	case m.hold > 0:
		st.Phase, st.Since, st.Count, st.AckedUntil, st.StableAt, st.AckedBy = Active, d, 0, 0, 0, ""
		st.Held, st.HeldAt, st.StormHeld = true, m.now, false
		st.Next = m.now + m.hold
		st.LastSeen = m.lastSeen
	default:
		st.Phase, st.Since, st.Count, st.AckedUntil, st.StableAt, st.AckedBy = Active, d, 0, 0, 0, ""
		st.LastSeen = m.lastSeen
		m.raise(st, "")
	}
	return true
}

// recovered handles the recovery from the loss at deadline d.
func (m machine) recovered(st *State, d int64, typ string) bool {
	if d <= st.Cleared {
		return false
	}
	newLoss := d > st.Deadline // its lost event is not handled yet
	if d < st.Deadline {
		// The recovery of an earlier loss: the alarm open now is for a
		// later one.
		return false
	}
	if typ != "" && st.Type == "" {
		st.Type = typ
	}
	st.Cleared = d
	flaps := false
	if newLoss {
		flaps = m.loss(st, d)
		st.Deadline = d
	}
	switch {
	case st.Phase == Active:
		m.resolve(st, ReasonRecovered)
		if flaps {
			m.damp(st, d)
		}
	case st.Phase == Damped:
		st.StableAt = m.now + m.p.FlapStable.Milliseconds()
	case flaps:
		m.damp(st, d)
	}
	return true
}

// ack acknowledges the alarm: until 0 resolves it, a later until pauses its
// repeats until then and says so (acked), unless nobody heard of the alarm
// yet (its raise is held). Another ack at the same count has the same id:
// a note of it still pending stands for it, one published already is
// dropped by JetStream. by is who acked. It reports false when there is
// no alarm to ack.
func (m machine) ack(st *State, until int64, by string) bool {
	if st.Phase == Idle {
		return false
	}
	st.AckedBy = by
	if until <= 0 {
		m.resolve(st, ReasonAcked)
		return true
	}
	st.AckedUntil = until
	id := NoteID(m.id, st.Since, Acked, st.Count)
	if !st.Held && !slices.ContainsFunc(st.Pending, func(n Note) bool { return n.ID == id }) {
		m.note(st, Acked, "")
	}
	return true
}

// remove resolves the alarm of a device that is no longer watched; lost
// events from before now raise nothing.
func (m machine) remove(st *State) {
	if st.Phase != Idle {
		m.resolve(st, ReasonRemoved)
	}
	st.Losses = nil
	st.Cleared = max(st.Cleared, m.now)
}
