package sinks

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestPagerDutyPagesOncePerAlarm: raise → repeat → ack → resolve is one
// trigger, one acknowledge and one resolve on the alarm's dedup_key; the
// repeat does not page.
func TestPagerDutyPagesOncePerAlarm(t *testing.T) {
	pd := testenv.NewPagerDuty(t, testenv.PagerDutyOptions{RoutingKeys: []string{"rk-1"}})
	d := newPagerDuty(pd.URL(), "rk-1", testClient(t, 2*time.Second))
	send(t, d, lifecycle()...)

	evs := pd.Events()
	want := []string{"trigger", "acknowledge", "resolve"}
	if len(evs) != len(want) || len(pd.Calls()) != len(want) {
		t.Fatalf("got %d events in %d calls, want %v", len(evs), len(pd.Calls()), want)
	}
	key := dispatch.LostID("dev-1", since)
	for i, ev := range evs {
		if ev.EventAction != want[i] || ev.DedupKey != key {
			t.Errorf("event %d: got %s %q, want %s %q", i, ev.EventAction, ev.DedupKey, want[i], key)
		}
	}
	pl := evs[0].Payload
	if pl.Severity != "critical" || pl.Source != "sigwatch" || pl.Component != "dev-1" || pl.Group != "site-a" || pl.Class != "meter" {
		t.Errorf("trigger payload: got %+v", pl)
	}
	if !strings.Contains(pl.Summary, "dev-1") || pl.CustomDetails["count"] != float64(1) {
		t.Errorf("trigger: summary %q, details %v", pl.Summary, pl.CustomDetails)
	}
}

// TestPagerDutyStormIsOneTrigger: a group alarm over 1,000 devices is one
// trigger listing 50 of them and the count; the storm event is not sent.
func TestPagerDutyStormIsOneTrigger(t *testing.T) {
	pd := testenv.NewPagerDuty(t, testenv.PagerDutyOptions{})
	d := newPagerDuty(pd.URL(), "rk-1", testClient(t, 2*time.Second))
	send(t, d, stormNote(), groupNote(1000))

	evs := pd.Events()
	if len(evs) != 1 {
		t.Fatalf("got %d events, want 1", len(evs))
	}
	ev := evs[0]
	if ev.DedupKey != "$sigwatch-storm/group:gw-7@"+itoa(since) {
		t.Errorf("dedup_key: got %q", ev.DedupKey)
	}
	cd := ev.Payload.CustomDetails
	devs, _ := cd["devices"].([]any)
	if len(devs) != 50 || cd["more_devices"] != float64(950) || cd["lost_devices"] != float64(1000) {
		t.Errorf("custom_details: got %d devices, more %v, lost %v; want 50, 950, 1000", len(devs), cd["more_devices"], cd["lost_devices"])
	}
	if ev.Payload.Group != "gw-7" || ev.Payload.Component != "group" {
		t.Errorf("payload: got group %q component %q", ev.Payload.Group, ev.Payload.Component)
	}
}

// TestPagerDutyLongDedupKey: an alarm id over 255 bytes becomes a key of
// 255 that is the same every time and differs from a near one.
func TestPagerDutyLongDedupKey(t *testing.T) {
	long := func(dev string) *dispatch.Alarm {
		return &dispatch.Alarm{ID: dispatch.LostID(dev, 1) + "/raised/1", Device: dev, Since: 1}
	}
	a, b := strings.Repeat("d", 300)+"a", strings.Repeat("d", 300)+"b"
	ka, kb := pdDedupKey(long(a)), pdDedupKey(long(b))
	if len(ka) != 255 || ka != pdDedupKey(long(a)) || ka == kb {
		t.Errorf("got %d bytes %q and %q", len(ka), ka, kb)
	}
	pd := testenv.NewPagerDuty(t, testenv.PagerDutyOptions{})
	d := newPagerDuty(pd.URL(), "rk-1", testClient(t, 2*time.Second))
	send(t, d, Notification{ID: "x", Alarm: long(a)})
}

// TestPagerDutyTest: a test is a trigger and a resolve on its own key.
func TestPagerDutyTest(t *testing.T) {
	pd := testenv.NewPagerDuty(t, testenv.PagerDutyOptions{})
	d := newPagerDuty(pd.URL(), "rk-1", testClient(t, 2*time.Second))
	send(t, d, Notification{ID: "t1", Test: true})
	evs := pd.Events()
	if len(evs) != 2 || evs[0].EventAction != "trigger" || evs[1].EventAction != "resolve" ||
		evs[0].DedupKey != "sigwatch-test-t1" || evs[1].DedupKey != "sigwatch-test-t1" {
		t.Fatalf("got %+v", evs)
	}
	if !strings.Contains(evs[0].Payload.Summary, "Test from sigwatch") {
		t.Errorf("summary: got %q", evs[0].Payload.Summary)
	}
}

// TestPagerDutyOutcomes: an unknown routing key is refused; past the rate
// limit it is a retry.
func TestPagerDutyOutcomes(t *testing.T) {
	pd := testenv.NewPagerDuty(t, testenv.PagerDutyOptions{RoutingKeys: []string{"rk-1"}, Rate: 1, Per: time.Minute})
	bad := newPagerDuty(pd.URL(), "nope", testClient(t, 2*time.Second))
	var refused *RefusedError
	if err := bad.deliver(t.Context(), deviceNote(stateRaised, "", 1)); !errors.As(err, &refused) || refused.Status != 400 || !strings.Contains(refused.Body, "Invalid routing key") {
		t.Errorf("unknown key: got %v, want a refusal with 400", err)
	}
	d := newPagerDuty(pd.URL(), "rk-1", testClient(t, 2*time.Second))
	send(t, d, deviceNote(stateRaised, "", 1))
	var retry *RetryError
	if err := d.deliver(t.Context(), deviceNote(Acked, "", 1)); !errors.As(err, &retry) {
		t.Errorf("over the rate: got %v, want a retry", err)
	}
}

// TestDedupKeyIsTheAlarm: every notification of one alarm has one key,
// whatever its id adds after the alarm's scope.
func TestDedupKeyIsTheAlarm(t *testing.T) {
	g := groupNote(3).Alarm
	ack := *g
	ack.ID, ack.State = strings.Replace(g.ID, "/raised/1", "/acked/1/1999", 1), Acked
	d := deviceNote(Acked, "", 2).Alarm
	d.ID += "/extra"
	for _, c := range []struct {
		a    *dispatch.Alarm
		want string
	}{
		{g, "$sigwatch-storm/group:gw-7@" + itoa(since)},
		{&ack, "$sigwatch-storm/group:gw-7@" + itoa(since)},
		{d, "dev-1@" + itoa(since)},
	} {
		if got := pdDedupKey(c.a); got != c.want {
			t.Errorf("id %s: got %q, want %q", c.a.ID, got, c.want)
		}
	}
}
