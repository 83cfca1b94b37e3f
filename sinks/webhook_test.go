package sinks

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/internal/webhooks"
)

// TestWebhookSendsEveryEvent: raise → repeat → ack → resolve and a storm
// event are five signed calls, each body the event's JSON as published,
// webhook-id its id.
func TestWebhookSendsEveryEvent(t *testing.T) {
	secret := webhooks.NewSecret()
	wr := testenv.NewWebhookReceiver(t, secret)
	d := newWebhook(wr.URL()+"/hook", []webhooks.Secret{secret}, testClient(t, 2*time.Second))
	ns := append(lifecycle(), stormNote())
	send(t, d, ns...)

	got := wr.Deliveries()
	if len(got) != len(ns) || wr.Rejected() != 0 {
		t.Fatalf("got %d deliveries, %d rejected; want %d", len(got), wr.Rejected(), len(ns))
	}
	for i, n := range ns {
		var want []byte
		if n.Alarm != nil {
			want, _ = json.Marshal(n.Alarm)
		} else {
			want, _ = json.Marshal(n.Storm)
		}
		if got[i].ID != n.ID || !bytes.Equal(got[i].Body, want) {
			t.Errorf("delivery %d: got %s %s, want %s %s", i, got[i].ID, got[i].Body, n.ID, want)
		}
	}
}

// TestWebhookRotation: signed with two secrets, a call verifies against
// either alone, as a receiver does before and after it switches.
func TestWebhookRotation(t *testing.T) {
	old, next := webhooks.NewSecret(), webhooks.NewSecret()
	wr := testenv.NewWebhookReceiver(t, old)
	d := newWebhook(wr.URL(), []webhooks.Secret{next, old}, testClient(t, 2*time.Second))
	send(t, d, deviceNote(stateRaised, "", 1))
	wr.SetSecrets(next)
	send(t, d, deviceNote(stateRepeat, "", 2))
	wr.SetSecrets(webhooks.NewSecret())
	if err := d.deliver(t.Context(), deviceNote(stateRepeat, "", 3)); err == nil {
		t.Errorf("a receiver with neither secret: got nil, want a refusal")
	}
	if n := len(wr.Deliveries()); n != 2 || wr.Rejected() != 1 {
		t.Errorf("got %d deliveries, %d rejected; want 2, 1", n, wr.Rejected())
	}
}

// TestWebhookTestBody: a test says "test": true.
func TestWebhookTestBody(t *testing.T) {
	secret := webhooks.NewSecret()
	wr := testenv.NewWebhookReceiver(t, secret)
	d := newWebhook(wr.URL(), []webhooks.Secret{secret}, testClient(t, 2*time.Second))
	send(t, d, Notification{ID: "t1", Test: true})
	got := wr.Deliveries()
	var body struct {
		Test bool `json:"test"`
	}
	if len(got) != 1 || got[0].ID != "t1" || json.Unmarshal(got[0].Body, &body) != nil || !body.Test {
		t.Fatalf("got %+v", got)
	}
}

// TestWebhookStormIsOneCall: a group alarm over 1,000 devices is one call
// whose body is the alarm as published.
func TestWebhookStormIsOneCall(t *testing.T) {
	secret := webhooks.NewSecret()
	wr := testenv.NewWebhookReceiver(t, secret)
	d := newWebhook(wr.URL(), []webhooks.Secret{secret}, testClient(t, 2*time.Second))
	n := groupNote(1000)
	send(t, d, n)
	want, _ := json.Marshal(n.Alarm)
	if got := wr.Deliveries(); len(got) != 1 || len(wr.Calls()) != 1 || !bytes.Equal(got[0].Body, want) {
		t.Fatalf("got %d deliveries in %d calls, want 1 with %s", len(got), len(wr.Calls()), want)
	}
}
