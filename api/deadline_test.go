package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/liveness"
)

// TestRequestTimeoutAnswers503: a handler that does not answer within
// http.request_timeout is answered for, 503 naming the setting, and its
// context is cancelled; one that answers in time is passed on as it is.
func TestRequestTimeoutAnswers503(t *testing.T) {
	a := New(Options{Config: Config{RequestTimeout: 100 * time.Millisecond}})
	cancelled := make(chan struct{})
	slow := a.deadline(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		close(cancelled)
		w.WriteHeader(http.StatusTeapot)
	}))
	rec := httptest.NewRecorder()
	start := time.Now()
	slow.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/stats", nil))
	if took := time.Since(start); rec.Code != http.StatusServiceUnavailable || took > time.Second ||
		!strings.Contains(rec.Body.String(), `"no answer within http.request_timeout (100ms)"`) {
		t.Errorf("slow handler: %d %s after %v, want 503 naming http.request_timeout within 1s", rec.Code, rec.Body, took)
	}
	select {
	case <-cancelled:
	case <-time.After(time.Second):
		t.Error("the slow handler's context was not cancelled")
	}

	fast := a.deadline(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Test", "1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("made"))
	}))
	rec = httptest.NewRecorder()
	fast.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/mutes", nil))
	if rec.Code != http.StatusCreated || rec.Body.String() != "made" || rec.Header().Get("X-Test") != "1" {
		t.Errorf("fast handler: %d %q %v, want 201 made with its header", rec.Code, rec.Body, rec.Header())
	}
}

// TestDependencyDownAnswers503: while Redis is down a request is answered
// at once, naming it; while NATS is down a request that waits is answered
// after natsGrace, naming NATS, and one that does not wait is passed on.
func TestDependencyDownAnswers503(t *testing.T) {
	deps := liveness.NewDeps(slog.New(slog.NewTextHandler(io.Discard, nil)))
	redisDown := atomic.Bool{}
	deps.Add("redis", func(context.Context) error {
		if redisDown.Load() {
			return errors.New("redis: connection refused")
		}
		return nil
	})
	deps.Add("nats", func(context.Context) error { return errors.New("not connected") })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = deps.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(5 * time.Second); deps.First() != "nats"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("NATS never seen down")
		}
	}
	a := New(Options{Config: Config{RequestTimeout: 10 * time.Second}, Deps: deps})
	waits := a.deadline(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	quick := a.deadline(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	serve := func(h http.Handler) (*httptest.ResponseRecorder, time.Duration) {
		rec := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/devices", nil))
		return rec, time.Since(start)
	}
	if rec, took := serve(waits); rec.Code != http.StatusServiceUnavailable || took < natsGrace || took > 2*time.Second ||
		!strings.Contains(rec.Body.String(), `"nats unavailable: not connected"`) {
		t.Errorf("waiting with NATS down: %d %s after %v, want 503 naming NATS after %v", rec.Code, rec.Body, took, natsGrace)
	}
	if rec, _ := serve(quick); rec.Code != http.StatusNoContent {
		t.Errorf("not waiting with NATS down: %d, want the handler's 204", rec.Code)
	}
	redisDown.Store(true)
	for deadline := time.Now().Add(5 * time.Second); deps.First() != "redis"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Redis never seen down")
		}
	}
	if rec, took := serve(quick); rec.Code != http.StatusServiceUnavailable || took > 100*time.Millisecond ||
		!strings.Contains(rec.Body.String(), `"redis unavailable: connection refused"`) {
		t.Errorf("with Redis down: %d %s after %v, want 503 naming Redis at once", rec.Code, rec.Body, took)
	}
}
