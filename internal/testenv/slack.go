package testenv

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// SlackOptions configures NewSlack.
type SlackOptions struct {
	// Rate messages per Per are accepted on one webhook URL, then 429 with Retry-After: Slack's
	// published one a second by default.
	Rate int
	Per  time.Duration
}

// SlackMessage is a message a Slack receiver accepted.
type SlackMessage struct {
	Path   string            // the webhook's path, e.g. /services/T0/B0/x
	Text   string            // the top-level text, if any
	Blocks []json.RawMessage // the Block Kit blocks, if any
	At     time.Time         // when it arrived
}

// Slack is a local receiver of Slack incoming webhooks: POST to any path with a JSON message
// that has text and/or blocks answers 200 "ok"; a body that is not such JSON answers 400
// "invalid_payload", a message with neither 400 "no_text" (Slack's documented answers), and more
// than the rate on one path answers 429 with Retry-After in seconds.
type Slack struct {
	*Receiver

	mu       sync.Mutex
	limit    *window
	messages []SlackMessage
}

// NewSlack starts a Slack receiver, stopped when the test ends.
func NewSlack(t testing.TB, opts SlackOptions) *Slack {
	t.Helper()
	if opts.Rate <= 0 {
		opts.Rate = 1
	}
	if opts.Per <= 0 {
		opts.Per = time.Second
	}
	s := &Slack{limit: newWindow(opts.Rate, opts.Per)}
	s.Receiver = newReceiver(t, s.handle)
	return s
}

// WebhookURL returns a webhook URL on the receiver; each channel is a path of its own, with a
// rate limit of its own.
func (s *Slack) WebhookURL(channel string) string {
	return s.URL() + "/services/T00000000/B00000000/" + channel
}

// Messages returns the messages accepted so far, in order.
func (s *Slack) Messages() []SlackMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.messages)
}

func (s *Slack) handle(w http.ResponseWriter, r *http.Request, body []byte) {
	at := time.Now()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		plainText(w, http.StatusMethodNotAllowed, "invalid_method")
		return
	}
	var msg struct {
		Text   *string         `json:"text"`
		Blocks json.RawMessage `json:"blocks"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&msg); err != nil {
		plainText(w, http.StatusBadRequest, "invalid_payload")
		return
	}
	var blocks []json.RawMessage
	if len(msg.Blocks) > 0 && string(msg.Blocks) != "null" {
		if err := json.Unmarshal(msg.Blocks, &blocks); err != nil {
			plainText(w, http.StatusBadRequest, "invalid_blocks")
			return
		}
	}
	text := ""
	if msg.Text != nil {
		text = *msg.Text
	}
	if text == "" && len(blocks) == 0 {
		plainText(w, http.StatusBadRequest, "no_text")
		return
	}
	s.mu.Lock()
	ok, wait := s.limit.take(r.URL.Path, at)
	if ok {
		s.messages = append(s.messages, SlackMessage{Path: r.URL.Path, Text: text, Blocks: blocks, At: at})
	}
	s.mu.Unlock()
	if !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		plainText(w, http.StatusTooManyRequests, "rate_limited")
		return
	}
	plainText(w, http.StatusOK, "ok")
}

// plainText answers as Slack does: the bare word, no newline.
func plainText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(status)
	w.Write([]byte(body))
}
