package testenv

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// maxBody bounds what a receiver reads of one request.
const maxBody = 1 << 20

// Call is one request a receiver got, whatever it answered.
type Call struct {
	At     time.Time // when the request arrived
	Method string
	Path   string
	Header http.Header
	Body   []byte
	Status int // what the receiver answered
}

// Receiver is a local HTTP server on 127.0.0.1 that records every call, for tests to point
// sinks at. PagerDuty, Slack and WebhookReceiver build on it. It can be taken down (connections
// refused) and brought back on the same port. Its methods are safe from any goroutine.
type Receiver struct {
	t      testing.TB
	addr   string
	handle func(w http.ResponseWriter, r *http.Request, body []byte)

	mu    sync.Mutex
	srv   *http.Server
	done  chan struct{} // closed when the current srv's Serve returns
	calls []Call
}

// newReceiver starts a receiver whose handle answers each request. It is stopped when the test
// ends.
func newReceiver(t testing.TB, handle func(w http.ResponseWriter, r *http.Request, body []byte)) *Receiver {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: receiver: %v", err)
	}
	r := &Receiver{t: t, addr: l.Addr().String(), handle: handle}
	r.serve(l)
	t.Cleanup(r.Down)
	return r
}

// URL is the receiver's base URL, http://127.0.0.1:port.
func (r *Receiver) URL() string { return "http://" + r.addr }

// Addr is the receiver's host:port.
func (r *Receiver) Addr() string { return r.addr }

// Calls returns a copy of every call so far, in order of arrival.
func (r *Receiver) Calls() []Call {
	r.mu.Lock()
	calls := slices.Clone(r.calls)
	r.mu.Unlock()
	// Concurrent calls are recorded as they finish.
	slices.SortStableFunc(calls, func(a, b Call) int { return a.At.Compare(b.At) })
	return calls
}

// Times returns the arrival times of the calls answered with status, or of every call when
// status is 0.
func (r *Receiver) Times(status int) []time.Time {
	var out []time.Time
	for _, c := range r.Calls() {
		if status == 0 || c.Status == status {
			out = append(out, c.At)
		}
	}
	return out
}

// Down closes the listener and every open connection: until Up, connections are refused, as a
// receiver that is down refuses them. Calls in progress are cut.
func (r *Receiver) Down() {
	r.mu.Lock()
	srv, done := r.srv, r.done
	r.srv, r.done = nil, nil
	r.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Close()
	<-done
}

// Up listens again on the same port. It retries for a few seconds while the port is held, e.g.
// by a client that took it as its own ephemeral port meanwhile.
func (r *Receiver) Up() {
	r.t.Helper()
	r.mu.Lock()
	up := r.srv != nil
	r.mu.Unlock()
	if up {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := net.Listen("tcp", r.addr)
		if err == nil {
			r.serve(l)
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("testenv: receiver back on %s: %v", r.addr, err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *Receiver) serve(l net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(r.serveHTTP), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	r.mu.Lock()
	r.srv, r.done = srv, done
	r.mu.Unlock()
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.t.Logf("testenv: receiver on %s: %v", r.addr, err)
		}
	}()
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(io.LimitReader(req.Body, maxBody))
	if err != nil {
		return // the sender went away
	}
	sw := &statusWriter{ResponseWriter: w}
	r.handle(sw, req, body)
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	r.mu.Lock()
	r.calls = append(r.calls, Call{At: at, Method: req.Method, Path: req.URL.Path, Header: req.Header.Clone(), Body: body, Status: sw.status})
	r.mu.Unlock()
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// OverBudget checks a rate budget over arrival times: it returns an error naming the first
// window [t, t+w) that holds more than budget of them, or nil when none does. The window slides
// over every arrival, so a limiter that lets a burst through at the edge of its second is caught.
func OverBudget(times []time.Time, budget int, w time.Duration) error {
	n, at := MaxInWindow(times, w)
	if n > budget {
		return fmt.Errorf("%d calls in the %v from %s, budget %d", n, w, at.Format("15:04:05.000"), budget)
	}
	return nil
}

// window is a sliding count of events per key, for the receivers' rate limits.
type window struct {
	n   int
	per time.Duration
	at  map[string][]time.Time
}

func newWindow(n int, per time.Duration) *window {
	return &window{n: n, per: per, at: map[string][]time.Time{}}
}

// take counts an event for key at now if the window has room, and otherwise returns how long
// until it will. The caller serialises calls.
func (w *window) take(key string, now time.Time) (ok bool, wait time.Duration) {
	ts := w.at[key]
	i := 0
	for i < len(ts) && now.Sub(ts[i]) >= w.per {
		i++
	}
	ts = ts[i:]
	if len(ts) >= w.n {
		w.at[key] = ts
		return false, w.per - now.Sub(ts[0])
	}
	w.at[key] = append(ts, now)
	return true, 0
}
