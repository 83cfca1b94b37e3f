package sinks

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// activeAlerts are the alerts Alertmanager shows: its API leaves out
// those resolved.
func activeAlerts(t *testing.T, am *servers.Alertmanager) []servers.AlertmanagerAlert {
	t.Helper()
	all, err := am.Alerts()
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// labelSets writes each alert's labels sorted, for a failure to show.
func labelSets(alerts []servers.AlertmanagerAlert) []string {
	var out []string
	for _, a := range alerts {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(a.Labels)) {
			kv = append(kv, k+"="+a.Labels[k])
		}
		out = append(out, strings.Join(kv, ","))
	}
	slices.Sort(out)
	return out
}

// waitAlerts waits until Alertmanager's active alerts have want label
// sets.
func waitAlerts(t *testing.T, am *servers.Alertmanager, want ...string) []servers.AlertmanagerAlert {
	t.Helper()
	slices.Sort(want)
	var got []servers.AlertmanagerAlert
	deadline := time.Now().Add(5 * time.Second)
	for {
		got = activeAlerts(t, am)
		if slices.Equal(labelSets(got), want) || want == nil && len(got) == 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("alerts: got %q, want %q", labelSets(got), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

const (
	devLabels   = "alertname=SigwatchDeviceLost,device=dev-1,scope=device,type=meter"
	ackedLabels = "acked=true,alertname=SigwatchDeviceLost,device=dev-1,scope=device,type=meter"
)

// TestAlertmanagerAlarmLifecycle against a real Alertmanager with a
// resolve_timeout of 1s: a raised alarm is an active alert with its
// labels, still active past resolve_timeout (its endsAt is far); the ack
// swaps it for the acked one; the resolve leaves none.
func TestAlertmanagerAlarmLifecycle(t *testing.T) {
	am := testenv.Alertmanager(t, servers.AlertmanagerOptions{ResolveTimeout: time.Second})
	d := newAlertmanager(am.URL, time.Minute, testClient(t, 2*time.Second))
	ns := lifecycle()

	send(t, d, ns[0])
	got := waitAlerts(t, am, devLabels)
	an := got[0].Annotations
	if an["lost_at"] != rfc3339(since) || an["last_seen"] != rfc3339(since-30_000) || an["count"] != "1" || an["group"] != "site-a" || !strings.Contains(an["summary"], "dev-1") {
		t.Errorf("annotations: got %v", an)
	}
	if !got[0].StartsAt.Equal(time.UnixMilli(since)) {
		t.Errorf("startsAt: got %v, want %v", got[0].StartsAt, time.UnixMilli(since))
	}
	time.Sleep(2 * time.Second) // past resolve_timeout
	waitAlerts(t, am, devLabels)

	send(t, d, ns[1]) // the repeat is the same alert
	got = waitAlerts(t, am, devLabels)
	if got[0].Annotations["count"] != "2" {
		t.Errorf("after the repeat: count %q, want 2", got[0].Annotations["count"])
	}
	send(t, d, ns[2])
	waitAlerts(t, am, ackedLabels)
	send(t, d, ns[3])
	waitAlerts(t, am)
}

// TestAlertmanagerResolveWithoutAck: a resolve of an alarm never acked
// ends it too, and sending it again changes nothing.
func TestAlertmanagerResolveWithoutAck(t *testing.T) {
	am := testenv.Alertmanager(t, servers.AlertmanagerOptions{ResolveTimeout: time.Second})
	d := newAlertmanager(am.URL, time.Minute, testClient(t, 2*time.Second))
	send(t, d, deviceNote(stateRaised, "", 1))
	waitAlerts(t, am, devLabels)
	send(t, d, deviceNote(stateResolved, "recovered", 1), deviceNote(stateResolved, "recovered", 1))
	waitAlerts(t, am)
}

// TestAlertmanagerStormIsOneAlert: a group alarm over 200 devices is one
// alert naming the group and listing 50 devices; the storm event is not
// sent.
func TestAlertmanagerStormIsOneAlert(t *testing.T) {
	am := testenv.Alertmanager(t, servers.AlertmanagerOptions{ResolveTimeout: time.Second})
	d := newAlertmanager(am.URL, time.Minute, testClient(t, 2*time.Second))
	send(t, d, stormNote(), groupNote(200))
	got := waitAlerts(t, am, "alertname=SigwatchGroupDark,group=gw-7,scope=group,type=sensor")
	an := got[0].Annotations
	if strings.Count(an["devices"], "gw-7-dev-") != 50 || !strings.HasSuffix(an["devices"], "and 150 more") || an["lost_devices"] != "200" {
		t.Errorf("annotations: got %v", an)
	}
}

// TestAlertmanagerAlertsOfOneStorm: the one call a 1,000-device group
// alarm makes holds one alert listing 50 devices and "and 950 more".
func TestAlertmanagerAlertsOfOneStorm(t *testing.T) {
	d := newAlertmanager("http://127.0.0.1:1", time.Minute, nil)
	alerts := d.alerts(groupNote(1000), time.Now())
	if len(alerts) != 1 {
		t.Fatalf("got %d alerts, want 1", len(alerts))
	}
	devs := alerts[0].Annotations["devices"]
	if strings.Count(devs, "gw-7-dev-") != 50 || !strings.HasSuffix(devs, "and 950 more") {
		t.Errorf("devices: got %q", devs)
	}
}

// TestAlertmanagerCalls: what each call of raise → repeat → ack → resolve
// sends: firing with endsAt far ahead; on ack the un-acked set ends at
// now and the acked one fires; on resolve both end at now, never before
// startsAt.
func TestAlertmanagerCalls(t *testing.T) {
	now := time.UnixMilli(since).Add(time.Hour)
	d := newAlertmanager("http://127.0.0.1:1", 10*time.Minute, nil)
	far, end := amTime(now.Add(10*time.Minute)), amTime(now)
	var got []string
	for _, n := range lifecycle() {
		var call []string
		for _, a := range d.alerts(n, now) {
			call = append(call, fmt.Sprintf("acked=%s ends=%s", a.Labels["acked"], a.EndsAt))
		}
		got = append(got, strings.Join(call, " + "))
	}
	want := []string{
		"acked= ends=" + far,
		"acked= ends=" + far,
		"acked= ends=" + end + " + acked=true ends=" + far,
		"acked= ends=" + end + " + acked=true ends=" + end,
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	early := d.alerts(deviceNote(stateResolved, "", 1), time.UnixMilli(since).Add(-time.Second))
	if early[0].EndsAt != early[0].StartsAt {
		t.Errorf("a resolve before its start: endsAt %s, startsAt %s", early[0].EndsAt, early[0].StartsAt)
	}
}

// TestAlertmanagerTestAlert: a test is a SigwatchTest alert.
func TestAlertmanagerTestAlert(t *testing.T) {
	am := testenv.Alertmanager(t, servers.AlertmanagerOptions{})
	d := newAlertmanager(am.URL, time.Minute, testClient(t, 2*time.Second))
	send(t, d, Notification{ID: "t1", Test: true})
	waitAlerts(t, am, "alertname=SigwatchTest,test_id=t1")
}
