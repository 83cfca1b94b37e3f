package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// PagerDutyOptions configures NewPagerDuty.
type PagerDutyOptions struct {
	// Rate events per Per are accepted for one routing key, then 429 until the window has room:
	// PagerDuty's published 120 a minute by default. A test sets a short Per to see the limit
	// without waiting a minute.
	Rate int
	Per  time.Duration
	// RoutingKeys, when set, are the only keys accepted; others get 400, as an unknown
	// integration key does.
	RoutingKeys []string
}

// PagerDutyEvent is an event of the Events API v2, as the receiver accepted it.
type PagerDutyEvent struct {
	RoutingKey  string            `json:"routing_key"`
	EventAction string            `json:"event_action"`
	DedupKey    string            `json:"dedup_key,omitempty"`
	Payload     *PagerDutyPayload `json:"payload,omitempty"`
	Client      string            `json:"client,omitempty"`
	ClientURL   string            `json:"client_url,omitempty"`

	At time.Time `json:"-"` // when it arrived
}

// PagerDutyPayload is the payload of a trigger event.
type PagerDutyPayload struct {
	Summary       string         `json:"summary"`
	Source        string         `json:"source"`
	Severity      string         `json:"severity"`
	Timestamp     string         `json:"timestamp,omitempty"`
	Component     string         `json:"component,omitempty"`
	Group         string         `json:"group,omitempty"`
	Class         string         `json:"class,omitempty"`
	CustomDetails map[string]any `json:"custom_details,omitempty"`
}

// PagerDuty is a local receiver of the PagerDuty Events API v2 (POST /v2/enqueue), answering as
// the documented contract does: 202 with the event's dedup_key, 400 for an invalid event, 429
// past the rate limit of its routing key (and the event is dropped, as PagerDuty drops it).
type PagerDuty struct {
	*Receiver
	opts PagerDutyOptions

	mu     sync.Mutex
	limit  *window
	events []PagerDutyEvent
}

// pagerDutyMaxDedupKey is the longest dedup_key PagerDuty takes.
const pagerDutyMaxDedupKey = 255

// NewPagerDuty starts a PagerDuty receiver, stopped when the test ends. Point a sink at
// EnqueueURL.
func NewPagerDuty(t testing.TB, opts PagerDutyOptions) *PagerDuty {
	t.Helper()
	if opts.Rate <= 0 {
		opts.Rate = 120
	}
	if opts.Per <= 0 {
		opts.Per = time.Minute
	}
	p := &PagerDuty{opts: opts, limit: newWindow(opts.Rate, opts.Per)}
	p.Receiver = newReceiver(t, p.handle)
	return p
}

// EnqueueURL is the URL events are posted to.
func (p *PagerDuty) EnqueueURL() string { return p.URL() + "/v2/enqueue" }

// Events returns the events accepted so far, in order.
func (p *PagerDuty) Events() []PagerDutyEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.events)
}

func (p *PagerDuty) handle(w http.ResponseWriter, r *http.Request, body []byte) {
	at := time.Now()
	if r.URL.Path != "/v2/enqueue" {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var ev PagerDutyEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		invalidEvent(w, "Event object is invalid", "body is not a JSON event object")
		return
	}
	if problem := p.check(&ev); problem != "" {
		invalidEvent(w, "Event object is invalid", problem)
		return
	}
	p.mu.Lock()
	ok, _ := p.limit.take(ev.RoutingKey, at)
	if ok {
		if ev.DedupKey == "" {
			ev.DedupKey = newDedupKey() // PagerDuty makes one up for a trigger without
		}
		ev.At = at
		p.events = append(p.events, ev)
	}
	p.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusTooManyRequests, map[string]any{
			"status": "throttle event", "message": "Requests for this service are arriving too quickly.  Please retry later.",
		})
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"status": "success", "message": "Event processed", "dedup_key": ev.DedupKey})
}

// check returns what is wrong with ev, in PagerDuty's words, or "".
func (p *PagerDuty) check(ev *PagerDutyEvent) string {
	switch {
	case ev.RoutingKey == "":
		return "'routing_key' is missing or blank"
	case len(p.opts.RoutingKeys) > 0 && !slices.Contains(p.opts.RoutingKeys, ev.RoutingKey):
		return "Invalid routing key"
	case len(ev.DedupKey) > pagerDutyMaxDedupKey:
		return "'dedup_key' is too long"
	}
	switch ev.EventAction {
	case "trigger":
		pl := ev.Payload
		switch {
		case pl == nil:
			return "'payload' is missing or blank"
		case pl.Summary == "":
			return "'payload.summary' is missing or blank"
		case pl.Source == "":
			return "'payload.source' is missing or blank"
		case !slices.Contains([]string{"critical", "error", "warning", "info"}, pl.Severity):
			return "'payload.severity' is invalid (must be one of critical, error, warning, info)"
		}
	case "acknowledge", "resolve":
		if ev.DedupKey == "" {
			return "'dedup_key' is missing or blank"
		}
	default:
		return "'event_action' is invalid (must be one of trigger, acknowledge, resolve)"
	}
	return ""
}

func invalidEvent(w http.ResponseWriter, message, problem string) {
	writeJSON(w, http.StatusBadRequest, map[string]any{"status": "invalid event", "message": message, "errors": []string{problem}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func newDedupKey() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}
