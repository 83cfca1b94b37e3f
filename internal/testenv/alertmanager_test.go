package testenv_test

import (
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// alertFor returns the alert with label device=device among am's, or nil.
func alertFor(t *testing.T, am *servers.Alertmanager, device string) *servers.AlertmanagerAlert {
	t.Helper()
	alerts, err := am.Alerts()
	if err != nil {
		t.Fatal(err)
	}
	for i := range alerts {
		if alerts[i].Labels["device"] == device {
			return &alerts[i]
		}
	}
	return nil
}

// TestAlertmanagerHoldsAndResolvesAlerts shows the Alertmanager a sink is tested against: an alert
// with a far endsAt stays, one without endsAt resolves itself after resolve_timeout (here 2s,
// which Alertmanager honours), and one sent again with a past endsAt is resolved.
func TestAlertmanagerHoldsAndResolvesAlerts(t *testing.T) {
	const resolveTimeout = 2 * time.Second
	am := testenv.Alertmanager(t, servers.AlertmanagerOptions{ResolveTimeout: resolveTimeout})
	now := time.Now()
	held := servers.AlertmanagerAlert{
		Labels:      map[string]string{"alertname": "DeviceLost", "device": "d1", "type": "meter", "scope": "device"},
		Annotations: map[string]string{"last_seen": now.Add(-time.Minute).Format(time.RFC3339)},
		StartsAt:    now,
		EndsAt:      now.Add(time.Hour),
	}
	bare := servers.AlertmanagerAlert{Labels: map[string]string{"alertname": "DeviceLost", "device": "d2"}, StartsAt: now}
	if err := am.PostAlerts(held, bare); err != nil {
		t.Fatal(err)
	}
	posted := time.Now()
	var got *servers.AlertmanagerAlert
	testenv.WaitFor(t, 5*time.Second, "both alerts active", func() bool {
		got = alertFor(t, am, "d1")
		d2 := alertFor(t, am, "d2")
		return got != nil && got.Status.State == "active" && d2 != nil && d2.Status.State == "active"
	})
	if got.Labels["type"] != "meter" || got.Labels["scope"] != "device" || got.Annotations["last_seen"] == "" {
		t.Fatalf("alert d1 shown as %+v", got)
	}

	testenv.WaitFor(t, resolveTimeout+5*time.Second, "the alert without endsAt to resolve itself", func() bool {
		return alertFor(t, am, "d2") == nil
	})
	gone := time.Since(posted)
	t.Logf("an alert without endsAt left after %v (resolve_timeout %v)", gone.Round(10*time.Millisecond), resolveTimeout)
	if gone < resolveTimeout-100*time.Millisecond {
		t.Fatalf("the alert without endsAt left after %v, before resolve_timeout %v", gone, resolveTimeout)
	}
	if alertFor(t, am, "d1") == nil {
		t.Fatalf("the alert with a far endsAt left with the other")
	}

	// A resolve keeps the alert's startsAt, so its endsAt must not be before it: Alertmanager
	// refuses "start time must be before end time" (400). Now is past by the time it arrives.
	early := held
	early.EndsAt = held.StartsAt.Add(-time.Second)
	if err := am.PostAlerts(early); err == nil {
		t.Fatalf("Alertmanager took an endsAt before startsAt")
	}
	held.EndsAt = time.Now()
	if err := am.PostAlerts(held); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the alert sent with a past endsAt to resolve", func() bool {
		return alertFor(t, am, "d1") == nil
	})
}

// TestAlertmanagerRestartsOnItsPort shows Kill and Restart: the same address answers again, and
// the alerts, which Alertmanager keeps in memory only, are gone.
func TestAlertmanagerRestartsOnItsPort(t *testing.T) {
	am := testenv.Alertmanager(t, servers.AlertmanagerOptions{})
	addr := am.Addr
	if err := am.PostAlerts(servers.AlertmanagerAlert{Labels: map[string]string{"alertname": "X", "device": "d1"}}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the alert", func() bool { return alertFor(t, am, "d1") != nil })
	if err := am.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := am.Alerts(); err == nil {
		t.Fatalf("a killed Alertmanager answered")
	}
	if err := am.Restart(); err != nil {
		t.Fatal(err)
	}
	if am.Addr != addr || alertFor(t, am, "d1") != nil {
		t.Fatalf("after restart: address %s (was %s), alert d1 %v", am.Addr, addr, alertFor(t, am, "d1"))
	}
}
