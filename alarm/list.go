package alarm

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/sigwatch/sigwatch/shard"
)

// The states an open alarm is listed under. Muted is not a phase: an alarm
// of any of the others is also muted while a mute covers it.
const (
	ListActive   = "active" // raised and repeating (View state raised)
	ListAcked    = Acked    // repeats paused by an ack with an end
	ListFlapping = Flapping
	ListMuted    = "muted"
	ListHeld     = Held // waiting for the storm hold, or held by a storm
)

// Listed is one row of the open-alarm listing.
type Listed struct {
	Device string `json:"device"`
	// Scope and Group name a group's or the fleet's storm alarm (Device
	// ""); Group is also the group of a device that has one.
	Scope      string `json:"scope,omitempty"`
	Group      string `json:"group,omitempty"`
	Type       string `json:"type"`
	State      string `json:"state"` // active, acked, flapping or held
	Since      int64  `json:"since"`
	Count      int    `json:"count"`
	NextRepeat int64  `json:"next_repeat,omitempty"`
	AckedUntil int64  `json:"acked_until,omitempty"`
	AckedBy    string `json:"acked_by,omitempty"` // who last acked it
	// Muted says a mute covers the alarm now; Mute is its id.
	Muted bool   `json:"muted,omitempty"`
	Mute  string `json:"mute,omitempty"`
}

// Query selects a page of open alarms: State one of ListActive, ListAcked,
// ListFlapping, ListMuted, ListHeld, several of them separated by commas
// (any of them), or "" (every open alarm); Type a type to keep ("" any),
// Group a group to keep ("" any; a storm alarm belongs to its group), Limit
// at most shard.MaxListLimit (0: 100), Cursor the "next" of the previous
// page.
type Query struct {
	State, Type, Group, Cursor string
	Limit                      int
}

// states splits q.State into the states it keeps (none: every one).
func (q Query) states() ([]string, error) {
	if q.State == "" {
		return nil, nil
	}
	out := strings.Split(q.State, ",")
	for _, s := range out {
		switch s {
		case ListActive, ListAcked, ListFlapping, ListMuted, ListHeld:
		default:
			return nil, shard.Refuse(ErrBadQuery, "state %q: give active, acked, muted, flapping or held (or several, comma-separated), or none for every open alarm", s)
		}
	}
	return out, nil
}

// keeps says whether l is in one of states (none: every open alarm).
func keeps(states []string, l Listed) bool {
	if len(states) == 0 {
		return true
	}
	for _, s := range states {
		if s == l.State || s == ListMuted && l.Muted {
			return true
		}
	}
	return false
}

// ErrBadQuery is returned for a listing query out of range.
var ErrBadQuery = errors.New("bad listing query")

// listed is the row of an open state, and whether it is open at all.
func listed(id string, st State, mutes []Mute, now int64) (Listed, bool) {
	l := Listed{Device: id, Type: st.Type, Since: st.Since, Count: st.Count, Group: st.Group, AckedBy: st.AckedBy}
	if sc, ok := scopeOf(id); ok {
		l.Device = ""
		l.Scope, l.Group = scopeName(sc)
	}
	switch {
	case st.Phase == Active && st.AckedUntil > 0:
		// Acked wins over held, as in the device's view.
		l.State, l.AckedUntil = ListAcked, st.AckedUntil
	case st.Phase == Active && st.Held:
		l.State = ListHeld
	case st.Phase == Damped:
		l.State = ListFlapping
	case st.Phase == Active:
		l.State, l.NextRepeat = ListActive, st.Next
	default:
		return l, false
	}
	for _, m := range mutes {
		if m.Covers(id, st.Type, now) {
			l.Muted, l.Mute = true, m.ID
			break
		}
	}
	return l, true
}

// List returns one page of open alarms and the cursor of the next page (""
// on the last). It pages over the open-alarm index, never over the idle
// states; paging guarantees are shard's (see shard/pager.go).
func (a *Alarms) List(ctx context.Context, q Query) ([]Listed, string, error) {
	states, err := q.states()
	if err != nil {
		return nil, "", err
	}
	if err := a.ensureIndex(ctx, false); err != nil {
		return nil, "", err
	}
	mutes, err := a.readMutes(ctx)
	if err != nil {
		return nil, "", err
	}
	now := a.opts.Now().UnixMilli()
	row := func(id, raw string) (Listed, bool) {
		var st State
		if json.Unmarshal([]byte(raw), &st) != nil {
			return Listed{}, false
		}
		l, ok := listed(id, st, mutes, now)
		if !ok || q.Type != "" && st.Type != q.Type || q.Group != "" && l.Group != q.Group || !keeps(states, l) {
			return Listed{}, false
		}
		return l, true
	}
	entries, next, err := a.store.ListParts(ctx, shard.PartQuery{Leaf: openLeaf, Cursor: q.Cursor, Limit: q.Limit,
		Keep: func(id, raw string) bool { _, ok := row(id, raw); return ok }})
	if err != nil {
		return nil, "", err
	}
	out := make([]Listed, 0, len(entries))
	for _, e := range entries {
		l, _ := row(e.Field, e.Value)
		out = append(out, l)
	}
	return out, next, nil
}
