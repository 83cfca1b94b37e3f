package sinks_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/sinks"
)

// TestAlertmanagerSinkKeepsAlarmsOpen, against a real Alertmanager with a
// 1 s resolve_timeout: a raised alarm is an alert with its labels, still
// active well past resolve_timeout and its own endsAt while the alarm is
// open (the sink re-sends it); an ack shows acked="true"; a resolve ends
// it; a group's alarm over 200 lost devices is one alert.
func TestAlertmanagerSinkKeepsAlarmsOpen(t *testing.T) {
	r := newRig(t)
	am := testenv.Alertmanager(t, servers.AlertmanagerOptions{ResolveTimeout: time.Second})
	devices := make([]string, 200)
	for i := range devices {
		devices[i] = fmt.Sprintf("gw-dev-%03d", i)
	}
	ss, err := sinks.New(t.Context(), sinks.Options{
		Sinks: []sinks.Config{{Name: "am", Type: sinks.TypeAlertmanager, URL: am.URL, Resend: 500 * time.Millisecond}},
		Store: r.store, Pub: r.pub,
		StormDevices: func(_ context.Context, scope string, limit int) ([]string, int, error) {
			if scope != "group:gw" {
				return []string{}, 0, nil
			}
			return devices[:min(limit, len(devices))], len(devices), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = ss.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	alerts := func() []servers.AlertmanagerAlert {
		as, err := am.Alerts()
		if err != nil {
			t.Fatal(err)
		}
		return as
	}
	find := func(label, value string) (servers.AlertmanagerAlert, bool) {
		for _, a := range alerts() {
			if a.Labels[label] == value {
				return a, true
			}
		}
		return servers.AlertmanagerAlert{}, false
	}
	since := time.Now().Add(-time.Minute).UnixMilli()
	r.publish(t, note("pump-7", "raised", since, 0))
	testenv.WaitFor(t, 10*time.Second, "the alert", func() bool { _, ok := find("device", "pump-7"); return ok })
	a, _ := find("device", "pump-7")
	if a.Labels["alertname"] != "SigwatchDeviceLost" || a.Labels["type"] != "meter" || a.Labels["scope"] != "device" {
		t.Errorf("labels %v", a.Labels)
	}
	// Past resolve_timeout and past the 2 s endsAt of the first send.
	time.Sleep(3500 * time.Millisecond)
	if _, ok := find("device", "pump-7"); !ok {
		t.Fatal("the alert of an open alarm ended")
	}

	r.publish(t, note("pump-7", sinks.Acked, since, 0))
	testenv.WaitFor(t, 10*time.Second, "the acked label", func() bool {
		n := 0
		for _, a := range alerts() {
			if a.Labels["device"] == "pump-7" {
				n++
				if a.Labels["acked"] != "true" {
					return false
				}
			}
		}
		return n == 1
	})

	group := dispatch.Alarm{ID: fmt.Sprintf("$sigwatch-storm/group:gw@%d/raised/0", since), Type: "sensor", State: "raised",
		Since: since, At: since, Group: "gw"}
	r.publish(t, group)
	testenv.WaitFor(t, 10*time.Second, "the group's alert", func() bool { _, ok := find("group", "gw"); return ok })
	n := 0
	for _, a := range alerts() {
		if a.Labels["group"] == "gw" || a.Labels["device"] != "" && a.Labels["device"] != "pump-7" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("a 200-device group storm made %d alerts, want 1", n)
	}

	r.publish(t, note("pump-7", "resolved", since, 0))
	testenv.WaitFor(t, 10*time.Second, "the resolved alert to leave", func() bool { _, ok := find("device", "pump-7"); return !ok })
	time.Sleep(1500 * time.Millisecond) // re-sends go on for the open group alarm only
	if _, ok := find("device", "pump-7"); ok {
		t.Error("a resolved alarm's alert came back")
	}
	if _, ok := find("group", "gw"); !ok {
		t.Error("the open group alarm's alert ended")
	}
}
