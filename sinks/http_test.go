package sinks

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/internal/webhooks"
)

// TestAnswersMapToOutcomes: 429 with Retry-After is a retry after that
// wait, 500 a retry, 410 gone, 400 a refusal, a receiver that is down a
// retry.
func TestAnswersMapToOutcomes(t *testing.T) {
	secret := webhooks.NewSecret()
	wr := testenv.NewWebhookReceiver(t, secret)
	d := newWebhook(wr.URL(), []webhooks.Secret{secret}, testClient(t, 2*time.Second))
	n := deviceNote(stateRaised, "", 1)
	var retry *RetryError
	var refused *RefusedError

	wr.Answer(http.StatusTooManyRequests, 7*time.Second)
	if err := d.deliver(t.Context(), n); !errors.As(err, &retry) || retry.After != 7*time.Second {
		t.Errorf("429: got %v, want a retry after 7s", err)
	}
	wr.Answer(http.StatusInternalServerError, 0)
	if err := d.deliver(t.Context(), n); !errors.As(err, &retry) || retry.After != 0 {
		t.Errorf("500: got %v, want a retry", err)
	}
	wr.Answer(http.StatusRequestTimeout, 0)
	if err := d.deliver(t.Context(), n); !errors.As(err, &retry) {
		t.Errorf("408: got %v, want a retry", err)
	}
	wr.Answer(http.StatusGone, 0)
	if err := d.deliver(t.Context(), n); !errors.Is(err, ErrGone) {
		t.Errorf("410: got %v, want ErrGone", err)
	}
	wr.Answer(http.StatusBadRequest, 0)
	if err := d.deliver(t.Context(), n); !errors.As(err, &refused) || refused.Status != 400 {
		t.Errorf("400: got %v, want a refusal", err)
	}
	wr.Answer(0, 0)
	wr.Down()
	if err := d.deliver(t.Context(), n); !errors.As(err, &retry) {
		t.Errorf("down: got %v, want a retry", err)
	}
	wr.Up()
	send(t, d, n)
}

// TestSlowSinkIsRetried: no answer within the call's timeout is a retry.
func TestSlowSinkIsRetried(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	d := newSlack(srv.URL+"/services/T/B/secret", testClient(t, 200*time.Millisecond))
	var retry *RetryError
	err := d.deliver(t.Context(), deviceNote(stateRaised, "", 1))
	if !errors.As(err, &retry) || !strings.Contains(err.Error(), "no answer within") {
		t.Errorf("got %v, want a retry for no answer", err)
	}
}

// TestErrorsHideTheURL: a Slack or webhook URL is a secret; no outcome
// repeats it.
func TestErrorsHideTheURL(t *testing.T) {
	sl := testenv.NewSlack(t, testenv.SlackOptions{Rate: 1, Per: time.Minute})
	d := newSlack(sl.WebhookURL("s3cr3t")+"?token=s3cr3t", testClient(t, 2*time.Second))
	n := deviceNote(stateRaised, "", 1)
	send(t, d, n)
	rateErr := d.deliver(t.Context(), n) // over Slack's rate: 429
	var retry *RetryError
	if !errors.As(rateErr, &retry) || retry.After <= 0 {
		t.Errorf("over the rate: got %v, want a retry with Retry-After", rateErr)
	}
	sl.Down()
	downErr := d.deliver(t.Context(), n)
	bad := newSlack("http://127.0.0.1:1/\x7fs3cr3t", testClient(t, time.Second)).deliver(t.Context(), n)
	for _, err := range []error{rateErr, downErr, bad} {
		t.Log(err)
		if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.HasPrefix(err.Error(), "slack") && !errors.As(err, new(*RefusedError)) {
			t.Errorf("got %v, want an error that names slack and not the URL", err)
		}
	}
}

// TestRetryAfter reads seconds and HTTP dates.
func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                              0,
		"120":                           2 * time.Minute,
		"0":                             0,
		"-3":                            0,
		"soon":                          0,
		"Fri, 02 Jan 2026 03:04:35 GMT": 30 * time.Second,
		"Fri, 02 Jan 2026 03:00:00 GMT": 0,
	} {
		if got := retryAfter(v, now); got != want {
			t.Errorf("Retry-After %q: got %v, want %v", v, got, want)
		}
	}
}

// TestRefusalIsShort: a refusal repeats at most 512 bytes of the answer.
func TestRefusalIsShort(t *testing.T) {
	if got := refusal([]byte(strings.Repeat("é", 400))); len(got) > maxRefusal {
		t.Errorf("got %d bytes", len(got))
	}
}
