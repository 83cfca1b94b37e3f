package sinks

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Alert names, by the scope of the alarm.
const (
	alertDeviceLost = "SigwatchDeviceLost"
	alertGroupDark  = "SigwatchGroupDark"
	alertFleetDark  = "SigwatchFleetDark"
	alertTest       = "SigwatchTest"
)

// testEndsAfter is how long a test alert stays active.
const testEndsAfter = 5 * time.Minute

// alertmanager posts alerts to Alertmanager's API v2. An open alarm is
// firing with an explicit endsAt endsAfter ahead, so that Alertmanager's
// resolve_timeout does not resolve it; the engine sends the open alarm
// again before that. A resolve is the same labels with endsAt now, which
// is never before startsAt, as Alertmanager demands.
type alertmanager struct {
	p         poster
	url       string // .../api/v2/alerts
	endsAfter time.Duration
}

// amAlert is an alert as POST /api/v2/alerts takes it.
type amAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations,omitempty"`
	StartsAt    string            `json:"startsAt,omitempty"`
	EndsAt      string            `json:"endsAt,omitempty"`
}

// newAlertmanager returns the driver of the Alertmanager at base (its
// root URL). endsAfter is how far ahead a firing alert's endsAt is.
func newAlertmanager(base string, endsAfter time.Duration, client *http.Client) *alertmanager {
	return &alertmanager{
		p:         newPoster("alertmanager", client),
		url:       strings.TrimSuffix(base, "/") + "/api/v2/alerts",
		endsAfter: endsAfter,
	}
}

// wants every alarm notification: a storm speaks through its scope alarm.
func (am *alertmanager) wants(n Notification) bool { return n.Test || n.Alarm != nil }

func (am *alertmanager) deliver(ctx context.Context, n Notification) error {
	alerts := am.alerts(n, am.p.now())
	if len(alerts) == 0 {
		return nil
	}
	return am.p.postJSON(ctx, am.url, alerts, nil)
}

// alerts are what one POST sends for n at now.
func (am *alertmanager) alerts(n Notification, now time.Time) []amAlert {
	if n.Test {
		return []amAlert{{
			Labels:      map[string]string{"alertname": alertTest, "test_id": n.ID},
			Annotations: map[string]string{"summary": "Test from sigwatch: this is not an alarm"},
			StartsAt:    amTime(now),
			EndsAt:      amTime(now.Add(testEndsAfter)),
		}}
	}
	if n.Alarm == nil {
		return nil
	}
	a := n.Alarm
	open := amAlert{
		Labels:      amLabels(n),
		Annotations: amAnnotations(n),
		StartsAt:    amTime(time.UnixMilli(a.Since)),
		EndsAt:      amTime(now.Add(am.endsAfter)),
	}
	acked := open
	acked.Labels = amLabels(n)
	acked.Labels["acked"] = "true"
	end := func(x amAlert) amAlert {
		x.EndsAt = amTime(maxTime(now, time.UnixMilli(a.Since)))
		return x
	}
	switch a.State {
	case Acked:
		// The un-acked alert ends and the acked one fires: one POST, so
		// that no moment shows neither.
		return []amAlert{end(open), acked}
	case stateResolved:
		// Whether or not it was acked: resolving a label set that never
		// fired is harmless to Alertmanager, and needs no memory here.
		return []amAlert{end(open), end(acked)}
	}
	return []amAlert{open}
}

// amLabels identifies an alarm's alert; its state is not a label, so that
// a repeat is the same alert. A device's group is an annotation: the
// device alone names it.
func amLabels(n Notification) map[string]string {
	a := n.Alarm
	l := map[string]string{"scope": scope(a)}
	if a.Type != "" {
		l["type"] = a.Type
	}
	switch scope(a) {
	case scopeDevice:
		l["alertname"], l["device"] = alertDeviceLost, a.Device
	case scopeGroup:
		l["alertname"], l["group"] = alertGroupDark, a.Group
	default:
		l["alertname"] = alertFleetDark
	}
	return l
}

// amAnnotations says what the alert is about.
func amAnnotations(n Notification) map[string]string {
	a := n.Alarm
	an := map[string]string{
		"summary": summary(n),
		"count":   strconv.Itoa(a.Count),
		"alarm":   alarmKey(a),
	}
	if a.Reason != "" {
		an["reason"] = a.Reason
	}
	if scope(a) == scopeDevice {
		an["lost_at"] = rfc3339(a.Since)
		if a.LastSeen > 0 {
			an["last_seen"] = rfc3339(a.LastSeen)
		}
		if a.Group != "" {
			an["group"] = a.Group
		}
	} else {
		an["since"] = rfc3339(a.Since)
		an["lost_devices"] = strconv.Itoa(lostDevices(n))
		an["devices"] = deviceList(n, func(d string) string { return d })
	}
	return an
}

func amTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// alertmanager is a driver.
var _ driver = (*alertmanager)(nil)
