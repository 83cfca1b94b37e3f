package testenv

import (
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/webhooks"
)

// WebhookDelivery is one webhook a WebhookReceiver accepted.
type WebhookDelivery struct {
	ID   string // webhook-id
	At   time.Time
	Body []byte
}

// WebhookReceiver is a local receiver of Standard Webhooks: it verifies each call's signature
// against its secrets (any one matching passes, so two are valid during a rotation), answers 204
// to a good one and 401 to a bad one, and counts deliveries by webhook-id so that a test can
// check each was delivered once. Answer makes it refuse calls for a while, as a receiver in
// trouble does; Down and Up (of Receiver) make it refuse connections.
type WebhookReceiver struct {
	*Receiver

	mu         sync.Mutex
	secrets    []webhooks.Secret
	tolerance  time.Duration
	status     int // what to answer instead of verifying; 0: verify
	retryAfter time.Duration
	delivered  []WebhookDelivery
	count      map[string]int
	rejected   int
}

// NewWebhookReceiver starts a webhook receiver that accepts signatures by any of secrets,
// stopped when the test ends.
func NewWebhookReceiver(t testing.TB, secrets ...webhooks.Secret) *WebhookReceiver {
	t.Helper()
	wr := &WebhookReceiver{secrets: secrets, count: map[string]int{}}
	wr.Receiver = newReceiver(t, wr.handle)
	return wr
}

// SetSecrets replaces the secrets the receiver verifies with, as a rotation finishing does.
func (wr *WebhookReceiver) SetSecrets(secrets ...webhooks.Secret) {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	wr.secrets = secrets
}

// SetTolerance sets how far a timestamp may be from now (0: the spec's five minutes).
func (wr *WebhookReceiver) SetTolerance(d time.Duration) {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	wr.tolerance = d
}

// Answer makes every call from now on be answered with status and nothing delivered: 429 (with
// Retry-After of retryAfter, in whole seconds, when above 0), 410 Gone, 500, ... Answer(0, 0)
// goes back to verifying and accepting.
func (wr *WebhookReceiver) Answer(status int, retryAfter time.Duration) {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	wr.status, wr.retryAfter = status, retryAfter
}

// Deliveries returns the webhooks accepted so far, in order; a webhook delivered twice is there
// twice.
func (wr *WebhookReceiver) Deliveries() []WebhookDelivery {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	return slices.Clone(wr.delivered)
}

// Count returns how often the webhook with id was accepted.
func (wr *WebhookReceiver) Count(id string) int {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	return wr.count[id]
}

// Duplicates returns the ids accepted more than once, sorted.
func (wr *WebhookReceiver) Duplicates() []string {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	var ids []string
	for id, n := range wr.count {
		if n > 1 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Rejected returns how many calls failed verification.
func (wr *WebhookReceiver) Rejected() int {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	return wr.rejected
}

func (wr *WebhookReceiver) handle(w http.ResponseWriter, r *http.Request, body []byte) {
	now := time.Now()
	wr.mu.Lock()
	defer wr.mu.Unlock()
	if wr.status != 0 {
		if wr.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int((wr.retryAfter+time.Second-1)/time.Second)))
		}
		w.WriteHeader(wr.status)
		return
	}
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	if err := webhooks.Verify(wr.secrets, r.Header, body, now, wr.tolerance); err != nil {
		wr.rejected++
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	id := r.Header.Get(webhooks.HeaderID)
	wr.delivered = append(wr.delivered, WebhookDelivery{ID: id, At: now, Body: body})
	wr.count[id]++
	w.WriteHeader(http.StatusNoContent)
}
