package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options configure a Client.
type Options struct {
	// URL is sigwatch's API, e.g. http://127.0.0.1:8080.
	URL string
	// Token is the API's bearer token (http.token), if it has one.
	Token string
	// HTTPClient defaults to a client with a 10s timeout. Give one whose
	// transport trusts the API's CA for https (http.tls), and shows a
	// client certificate for mutual TLS; see Example_https.
	HTTPClient *http.Client
	// NATS is needed by Publish, Request and Subscribe.
	NATS *nats.Conn
	// Prefix is the first subject token (nats.prefix), default "sigwatch".
	Prefix string
	// Stream is sigwatch's event stream (nats.stream), default "SIGWATCH".
	Stream string
}

// Client talks to one sigwatch installation. It is safe for concurrent use.
type Client struct {
	opts Options
	base *url.URL
	hc   *http.Client
	js   jetstream.JetStream
}

// New returns a client. It does not contact anything.
func New(opts Options) (*Client, error) {
	opts.Prefix = cmp.Or(opts.Prefix, "sigwatch")
	opts.Stream = cmp.Or(opts.Stream, "SIGWATCH")
	c := &Client{opts: opts, hc: opts.HTTPClient}
	if c.hc == nil {
		c.hc = &http.Client{Timeout: 10 * time.Second}
	}
	if opts.URL != "" {
		u, err := url.Parse(opts.URL)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return nil, fmt.Errorf("client: URL %q: want e.g. http://127.0.0.1:8080", opts.URL)
		}
		c.base = u
	}
	if opts.NATS != nil {
		js, err := jetstream.New(opts.NATS)
		if err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
		c.js = js
	}
	return c, nil
}

// Timer is a stored timer.
type Timer struct {
	Queue    string          `json:"queue"`
	ID       string          `json:"id"`
	Deadline int64           `json:"deadline"` // unix ms
	Payload  json.RawMessage `json:"payload,omitempty"`
}

// At is the timer's deadline.
func (t Timer) At() time.Time { return time.UnixMilli(t.Deadline) }

// Mode says how a reset moves a deadline.
type Mode string

const (
	// Extend only ever moves a deadline later (the default).
	Extend Mode = "extend"
	// Set overwrites it, earlier or later.
	Set Mode = "set"
)

// ClearPayload, given as a payload, removes the timer's payload. A nil
// payload keeps it.
var ClearPayload = json.RawMessage("null")

// Reset is one reset: After or At, the others optional.
type Reset struct {
	ID      string
	After   time.Duration
	At      time.Time
	Mode    Mode
	Payload any // nil keeps the payload; ClearPayload removes it
}

// body is a reset as the API and the NATS path take it.
type body struct {
	ID      string          `json:"id,omitempty"`
	After   string          `json:"after,omitempty"`
	At      int64           `json:"at,omitempty"`
	Mode    Mode            `json:"mode,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

func (r Reset) body(withID bool) (body, error) {
	b := body{Mode: r.Mode}
	if withID {
		b.ID = r.ID
	}
	switch {
	case !r.At.IsZero() && r.After != 0:
		return b, errors.New("client: give After or At, not both")
	case !r.At.IsZero():
		b.At = r.At.UnixMilli()
	default:
		b.After = r.After.String()
	}
	if r.Payload != nil {
		p, err := json.Marshal(r.Payload)
		if err != nil {
			return b, fmt.Errorf("client: payload: %w", err)
		}
		b.Payload = p
	}
	return b, nil
}

// bodies are the bodies of a batch of resets, each with its id.
func bodies(rs []Reset) ([]body, error) {
	bs := make([]body, len(rs))
	for j, r := range rs {
		b, err := r.body(true)
		if err != nil {
			return nil, fmt.Errorf("reset %d: %w", j, err)
		}
		bs[j] = b
	}
	return bs, nil
}

// Reset arms timer id of queue to fire after d, or pushes it back
// (extend: never earlier than it was), with payload (nil: keep).
func (c *Client) Reset(ctx context.Context, queue, id string, after time.Duration, payload any) (Timer, error) {
	return c.ResetWith(ctx, queue, Reset{ID: id, After: after, Payload: payload})
}

// ResetAt is Reset with a deadline.
func (c *Client) ResetAt(ctx context.Context, queue, id string, at time.Time, payload any) (Timer, error) {
	return c.ResetWith(ctx, queue, Reset{ID: id, At: at, Payload: payload})
}

// ResetWith stores one reset as r says (e.g. Mode: Set) and returns the
// deadline that holds.
func (c *Client) ResetWith(ctx context.Context, queue string, r Reset) (Timer, error) {
	if err := CheckQueue(queue); err != nil {
		return Timer{}, err
	}
	b, err := r.body(false)
	if err != nil {
		return Timer{}, err
	}
	var t Timer
	err = c.do(ctx, http.MethodPut, timerPath(queue, r.ID), b, &t)
	return t, err
}

// ResetBatch stores rs in queue as one batch: all or, with an error,
// none.
func (c *Client) ResetBatch(ctx context.Context, queue string, rs []Reset) error {
	if err := CheckQueue(queue); err != nil {
		return err
	}
	bs, err := bodies(rs)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, "/v1/timers/"+queue, bs, nil)
}

// Get returns timer id of queue, and false when there is none (never set,
// fired or cancelled). A timer that fired is removed once its event is
// stored, so a subscriber handling that event may still find it for a
// moment, with its deadline in the past.
func (c *Client) Get(ctx context.Context, queue, id string) (Timer, bool, error) {
	if err := CheckQueue(queue); err != nil {
		return Timer{}, false, err
	}
	var t Timer
	err := c.do(ctx, http.MethodGet, timerPath(queue, id), nil, &t)
	if e := (*Error)(nil); errors.As(err, &e) && e.Status == http.StatusNotFound {
		return Timer{}, false, nil
	}
	return t, err == nil, err
}

// Cancel removes timer id of queue so that it does not fire, and reports
// whether there was one.
func (c *Client) Cancel(ctx context.Context, queue, id string) (bool, error) {
	if err := CheckQueue(queue); err != nil {
		return false, err
	}
	err := c.do(ctx, http.MethodDelete, timerPath(queue, id), nil, nil)
	if e := (*Error)(nil); errors.As(err, &e) && e.Status == http.StatusNotFound {
		return false, nil
	}
	return err == nil, err
}

// Publish sends resets of queue over NATS, in one message, and returns once
// JetStream has stored it: sigwatch then stores the resets and only then
// acknowledges them, so none is lost while sigwatch or Redis is down.
// Deadlines given by After count from when sigwatch stores them.
func (c *Client) Publish(ctx context.Context, queue string, rs ...Reset) error {
	if c.js == nil {
		return errors.New("client: Publish needs Options.NATS")
	}
	data, err := natsBody(queue, rs)
	if err != nil {
		return err
	}
	if _, err := c.js.Publish(ctx, c.opts.Prefix+".timers.set."+queue, data); err != nil {
		return fmt.Errorf("client: publish resets: %w", err)
	}
	return nil
}

// natsBody is the message that carries rs of queue over NATS, the same for
// the stream and the request path.
func natsBody(queue string, rs []Reset) ([]byte, error) {
	if err := CheckQueue(queue); err != nil {
		return nil, err
	}
	bs, err := bodies(rs)
	if err != nil {
		return nil, err
	}
	return json.Marshal(bs)
}

// Request stores resets of queue over a NATS request, and returns once
// sigwatch has stored them in Redis: one broker round trip, with no stream
// in between, the cheapest way to send one reset per message and know it is
// stored. A request is stored whole or refused whole (*Error with Status
// 400, nothing stored); *Error with Status 503 says no sigwatch process
// answered or Redis did not take it, and trying again may succeed. Unlike
// Publish, the broker holds nothing while sigwatch is down: the caller
// retries. Deadlines given by After count from when sigwatch stores them.
func (c *Client) Request(ctx context.Context, queue string, rs ...Reset) error {
	if c.opts.NATS == nil {
		return errors.New("client: Request needs Options.NATS")
	}
	data, err := natsBody(queue, rs)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cmp.Or(c.hc.Timeout, 10*time.Second))
		defer cancel()
	}
	m, err := c.opts.NATS.RequestWithContext(ctx, c.opts.Prefix+".timers.reset."+queue, data)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return &Error{Status: http.StatusServiceUnavailable, Message: "no sigwatch process takes timer reset requests (timers.nats off, or none running)"}
	case err != nil:
		return fmt.Errorf("client: reset request: %w", err)
	}
	var r struct {
		Stored int    `json:"stored"`
		Status int    `json:"status"`
		Error  string `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return fmt.Errorf("client: reset request: bad answer %q: %w", m.Data, err)
	}
	if r.Status != 0 {
		return &Error{Status: r.Status, Message: r.Error}
	}
	return nil
}

// Error is an answer of the API other than success.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("sigwatch: %d: %s", e.Status, e.Message) }

// Temporary reports whether trying again may succeed (sigwatch or what it
// depends on did not answer).
func (e *Error) Temporary() bool { return e.Status >= 500 || e.Status == http.StatusTooManyRequests }

func timerPath(queue, id string) string {
	return "/v1/timers/" + queue + "/" + url.PathEscape(id)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	if c.base == nil {
		return errors.New("client: Options.URL is not set")
	}
	var rd io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	u := *c.base
	u.RawPath = strings.TrimSuffix(c.base.EscapedPath(), "/") + path
	u.Path, _ = url.PathUnescape(u.RawPath)
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.Token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 300 {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return &Error{Status: resp.StatusCode, Message: msg}
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("client: %s %s: %w", method, path, err)
		}
	}
	return nil
}

// CheckQueue refuses a queue name sigwatch would refuse:
// [A-Za-z0-9_-]{1,64}.
func CheckQueue(q string) error {
	ok := q != "" && len(q) <= 64
	for i := 0; ok && i < len(q); i++ {
		c := q[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	if !ok {
		return fmt.Errorf("client: queue %q: 1 to 64 characters of A-Z a-z 0-9 _ -", q)
	}
	return nil
}
