package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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
