package sinks

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sigwatch/sigwatch/dispatch"
)

// The states of an alarm notification (alarm's Raised, Repeat, Flapping
// and Resolved), besides Acked.
const (
	stateRaised   = "raised"
	stateRepeat   = "repeat"
	stateFlapping = "flapping"
	stateResolved = "resolved"
)

// Scopes of an alarm: a device's, or a storm's over a group or the fleet.
const (
	scopeDevice = "device"
	scopeGroup  = dispatch.ScopeGroup
	scopeFleet  = dispatch.ScopeFleet
)

// scope says whose alarm a is: a device's, a group's or the fleet's.
func scope(a *dispatch.Alarm) string {
	switch {
	case a.Device != "":
		return scopeDevice
	case a.Group != "":
		return scopeGroup
	default:
		return scopeFleet
	}
}

// alarmKey is the id of the alarm a notification belongs to, the same for
// all its notifications: the scope of its id, <device>@<since>, without
// what follows (/<state>/<count>). A scope alarm's "device" is its
// reserved storm id, which only its notification's id spells.
func alarmKey(a *dispatch.Alarm) string {
	if a.Device != "" {
		return dispatch.LostID(a.Device, a.Since)
	}
	at := "@" + strconv.FormatInt(a.Since, 10)
	if i := strings.LastIndex(a.ID, at+"/"); i > 0 {
		return a.ID[:i+len(at)]
	}
	// Not a notification's id: a key of the same shape from the fields.
	who := "fleet"
	if a.Group != "" {
		who = "group:" + a.Group
	}
	return dispatch.LostID(who, a.Since)
}

// boundKey keeps key within max bytes: a longer one keeps its start and
// ends with a hash of the whole, so that it stays the same for the same
// key and differs for different ones.
func boundKey(key string, max int) string {
	if len(key) <= max {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	tail := "~" + hex.EncodeToString(sum[:16])
	return clip(key, max-len(tail)) + tail
}

// deviceList writes a scope alarm's devices as "a, b and N more"; quote
// wraps each device (Slack's code marks, say).
func deviceList(n Notification, quote func(string) string) string {
	var b strings.Builder
	for i, d := range n.Devices {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(quote(d))
	}
	if n.More > 0 {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "and %d more", n.More)
	}
	return b.String()
}

// lostDevices is how many devices a scope alarm's notification counts.
func lostDevices(n Notification) int { return len(n.Devices) + n.More }

// rfc3339 writes a time in unix ms as RFC 3339 in UTC.
func rfc3339(ms int64) string {
	return time.UnixMilli(ms).UTC().Format(time.RFC3339)
}

// summary is one line that says what the alarm is, for a title or a page.
func summary(n Notification) string {
	a := n.Alarm
	who, lost := "device "+a.Device+" ("+a.Type+")", "lost"
	switch scope(a) {
	case scopeGroup:
		who, lost = "group "+a.Group, "dark"
	case scopeFleet:
		who, lost = "the fleet", "dark"
	}
	since := " since " + rfc3339(a.Since)
	count := ""
	if scope(a) != scopeDevice && lostDevices(n) > 0 {
		count = ", " + strconv.Itoa(lostDevices(n)) + " devices lost"
	}
	switch a.State {
	case stateFlapping:
		return who + " is flapping" + since
	case Acked:
		return who + " is " + lost + since + count + ", acknowledged"
	case stateResolved:
		s := "resolved"
		if a.Reason != "" {
			s += " (" + a.Reason + ")"
		}
		return s + ": " + who + " was " + lost + since
	}
	return who + " is " + lost + since + count
}

// clip cuts s to at most max bytes, on a rune's boundary.
func clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	s = s[:max]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
