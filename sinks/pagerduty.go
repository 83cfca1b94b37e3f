package sinks

import (
	"context"
	"net/http"
	"strings"

	"github.com/sigwatch/sigwatch/dispatch"
)

// DefaultPagerDutyURL is the Events API v2's host.
const DefaultPagerDutyURL = "https://events.pagerduty.com"

// maxSummary is the longest summary PagerDuty keeps.
const maxSummary = 1024

// maxDedupKey is the longest dedup_key PagerDuty takes.
const maxDedupKey = 255

// pagerduty sends events of the Events API v2 under one routing key. An
// alarm is one incident: its dedup_key is the alarm's id without its
// state, so that a redelivered trigger joins the open incident instead of
// paging again.
type pagerduty struct {
	p          poster
	url        string // .../v2/enqueue
	routingKey string
}

// newPagerDuty returns the driver of the Events API at base (""
// for PagerDuty's own) with routingKey.
func newPagerDuty(base, routingKey string, client *http.Client) *pagerduty {
	if base == "" {
		base = DefaultPagerDutyURL
	}
	return &pagerduty{
		p:          newPoster("pagerduty", client),
		url:        strings.TrimSuffix(base, "/") + "/v2/enqueue",
		routingKey: routingKey,
	}
}

// pdEvent is an Events API v2 event.
type pdEvent struct {
	RoutingKey  string     `json:"routing_key"`
	EventAction string     `json:"event_action"`
	DedupKey    string     `json:"dedup_key"`
	Payload     *pdPayload `json:"payload,omitempty"`
	Client      string     `json:"client,omitempty"`
}

type pdPayload struct {
	Summary       string         `json:"summary"`
	Source        string         `json:"source"`
	Severity      string         `json:"severity"`
	Timestamp     string         `json:"timestamp,omitempty"`
	Component     string         `json:"component,omitempty"`
	Group         string         `json:"group,omitempty"`
	Class         string         `json:"class,omitempty"`
	CustomDetails map[string]any `json:"custom_details,omitempty"`
}

// wants raises, flaps, acks and resolves; a repeat does not page again
// and a storm pages through its scope alarm.
func (pd *pagerduty) wants(n Notification) bool {
	if n.Test {
		return true
	}
	if n.Alarm == nil {
		return false
	}
	switch n.Alarm.State {
	case stateRaised, stateFlapping, Acked, stateResolved:
		return true
	}
	return false
}

func (pd *pagerduty) deliver(ctx context.Context, n Notification) error {
	if n.Test {
		return pd.test(ctx, n)
	}
	if !pd.wants(n) {
		return nil
	}
	a := n.Alarm
	ev := pdEvent{RoutingKey: pd.routingKey, DedupKey: pdDedupKey(a), Client: "sigwatch"}
	switch a.State {
	case Acked:
		ev.EventAction = "acknowledge"
	case stateResolved:
		ev.EventAction = "resolve"
	default:
		ev.EventAction = "trigger"
		ev.Payload = pdTrigger(n)
	}
	return pd.p.postJSON(ctx, pd.url, ev, nil)
}

// test triggers an incident marked as a test and resolves it at once.
func (pd *pagerduty) test(ctx context.Context, n Notification) error {
	key := boundKey("sigwatch-test-"+n.ID, maxDedupKey)
	trigger := pdEvent{
		RoutingKey: pd.routingKey, EventAction: "trigger", DedupKey: key, Client: "sigwatch",
		Payload: &pdPayload{
			Summary: "Test from sigwatch: this is not an alarm", Source: "sigwatch", Severity: "info",
			Timestamp: amTime(pd.p.now()), Class: "test",
			CustomDetails: map[string]any{"test": true},
		},
	}
	if err := pd.p.postJSON(ctx, pd.url, trigger, nil); err != nil {
		return err
	}
	resolve := pdEvent{RoutingKey: pd.routingKey, EventAction: "resolve", DedupKey: key, Client: "sigwatch"}
	return pd.p.postJSON(ctx, pd.url, resolve, nil)
}

// pdDedupKey is the alarm's id without its state and count, at most 255
// bytes (a longer one ends with a hash of the whole).
func pdDedupKey(a *dispatch.Alarm) string { return boundKey(alarmKey(a), maxDedupKey) }

// pdTrigger is the payload of an alarm's trigger. A lost device or a dark
// group or fleet is critical; a flapping device, which keeps coming back,
// is a warning.
func pdTrigger(n Notification) *pdPayload {
	a := n.Alarm
	severity := "critical"
	if a.State == stateFlapping {
		severity = "warning"
	}
	details := map[string]any{
		"state": a.State, "since": rfc3339(a.Since), "count": a.Count, "alarm": alarmKey(a),
	}
	if a.Reason != "" {
		details["reason"] = a.Reason
	}
	if a.LastSeen > 0 {
		details["last_seen"] = rfc3339(a.LastSeen)
	}
	pl := &pdPayload{
		Summary: clip(summary(n), maxSummary), Source: "sigwatch", Severity: severity,
		Timestamp: rfc3339(a.Since), Component: a.Device, Group: a.Group, Class: a.Type,
		CustomDetails: details,
	}
	if scope(a) != scopeDevice {
		pl.Component = scope(a)
		details["lost_devices"] = lostDevices(n)
		details["devices"] = n.Devices
		if n.More > 0 {
			details["more_devices"] = n.More
		}
	}
	return pl
}

// pagerduty is a driver.
var _ driver = (*pagerduty)(nil)
