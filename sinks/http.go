package sinks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultTimeout bounds one call to a sink when its client sets no timeout.
const DefaultTimeout = 10 * time.Second

// maxRefusal bounds how much of a refusal's body an error repeats.
const maxRefusal = 512

// poster sends one JSON POST to a sink and turns the answer into a
// driver's outcome. Its errors name the kind of sink, never the URL: a
// Slack or webhook URL may hold a secret.
type poster struct {
	kind    string // "alertmanager", "pagerduty", "slack", "webhook"
	client  *http.Client
	timeout time.Duration
	now     func() time.Time
}

func newPoster(kind string, client *http.Client) poster {
	if client == nil {
		client = http.DefaultClient
	}
	timeout := client.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return poster{kind: kind, client: client, timeout: timeout, now: time.Now}
}

// postJSON marshals v and posts it to u.
func (p poster) postJSON(ctx context.Context, u string, v any, header http.Header) error {
	body, err := json.Marshal(v)
	if err != nil {
		return &RefusedError{Body: fmt.Sprintf("%s: cannot encode the notification: %v", p.kind, err)}
	}
	return p.post(ctx, u, body, header)
}

// post sends body to u with header and returns nil on a 2xx answer, a
// *RetryError on 408, 429, 5xx or when the sink cannot be reached in
// time, ErrGone on 410 and a *RefusedError on any other answer.
func (p poster) post(ctx context.Context, u string, body []byte, header http.Header) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		// The URL is checked when the sink is configured; say no more of it.
		return &RefusedError{Body: p.kind + ": the sink's URL is not valid"}
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sigwatch")
	resp, err := p.client.Do(req)
	if err != nil {
		return &RetryError{Err: fmt.Errorf("%s: %s", p.kind, p.reachError(ctx, err))}
	}
	defer resp.Body.Close()
	start, _ := io.ReadAll(io.LimitReader(resp.Body, maxRefusal))
	// Drain a little more so that the connection can be used again.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusGone:
		return fmt.Errorf("%s: %w", p.kind, ErrGone)
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		return &RetryError{
			After: retryAfter(resp.Header.Get("Retry-After"), p.now()),
			Err:   fmt.Errorf("%s: answered %d %s", p.kind, code, http.StatusText(code)),
		}
	default:
		return &RefusedError{Status: code, Body: refusal(start)}
	}
}

// reachError says why a call got no answer, without the URL that
// url.Error would print.
func (p poster) reachError(ctx context.Context, err error) string {
	if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
		return "no answer within " + p.timeout.String()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		if ue.Timeout() {
			return "no answer within " + p.timeout.String()
		}
		err = ue.Err
	}
	return "could not reach the sink: " + err.Error()
}

// retryAfter reads a Retry-After header: delay-seconds or an HTTP date.
// It returns 0 when there is none or it cannot be read.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, int64(24*time.Hour/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// refusal is the readable start of a refusal's body.
func refusal(b []byte) string {
	if len(b) > maxRefusal {
		b = b[:maxRefusal]
	}
	// A cut in the middle of a rune leaves no invalid tail behind.
	s := strings.ToValidUTF8(string(b), "")
	return strings.Join(strings.Fields(s), " ")
}
