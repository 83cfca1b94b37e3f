package sinks

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/sigwatch/sigwatch/internal/webhooks"
)

// webhook posts every alarm notification and storm event, its body the
// event's JSON as sigwatch publishes it, signed as Standard Webhooks
// says: one signature per secret, so that a receiver keeps working while
// the secret is rotated. webhook-id is the event's id, the same on every
// retry, for the receiver to de-duplicate on.
type webhook struct {
	p       poster
	url     string
	secrets []webhooks.Secret
}

// newWebhook returns the driver of the webhook at url, signing with
// secrets (the new one first during a rotation, say).
func newWebhook(url string, secrets []webhooks.Secret, client *http.Client) *webhook {
	return &webhook{p: newPoster("webhook", client), url: url, secrets: secrets}
}

// webhookTest is the body of a test notification.
type webhookTest struct {
	ID   string `json:"id"`
	Test bool   `json:"test"`
	At   int64  `json:"at"`
}

func (w *webhook) wants(n Notification) bool { return true }

func (w *webhook) deliver(ctx context.Context, n Notification) error {
	now := w.p.now()
	var v any
	switch {
	case n.Test:
		v = webhookTest{ID: n.ID, Test: true, At: now.UnixMilli()}
	case n.Alarm != nil:
		v = n.Alarm
	case n.Storm != nil:
		v = n.Storm
	default:
		return nil
	}
	body, err := json.Marshal(v)
	if err != nil {
		return &RefusedError{Body: "webhook: cannot encode the notification: " + err.Error()}
	}
	return w.p.post(ctx, w.url, body, webhooks.Header(w.secrets, n.ID, now, body))
}

// webhook is a driver.
var _ driver = (*webhook)(nil)
