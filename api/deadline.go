package api

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// natsGrace is how long a request may wait while NATS is down before it is
// answered 503: most routes do not need NATS and finish well within it.
const natsGrace = time.Second

// deadline gives every request an answer in time: 503 at once while Redis
// is down (every /v1 route reads or writes it), 503 as soon as Redis goes
// down under a request or NATS stays down past natsGrace, and 503 once
// http.request_timeout has passed. Each names what the request waited on.
// The handler runs in a goroutine of its own with a cancelled context
// after that, because a Redis client that reconnects may not heed it.
func (a *API) deadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if why, down := a.o.Deps.Down("redis"); down {
			writeError(w, http.StatusServiceUnavailable, "redis unavailable: "+why)
			return
		}
		timeout := cmp.Or(a.o.RequestTimeout, DefaultConfig().RequestTimeout)
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		tw := &timeoutWriter{h: make(http.Header)}
		done := make(chan struct{})
		var panicked any
		go func() {
			defer close(done)
			defer func() { panicked = recover() }()
			next.ServeHTTP(tw, r.WithContext(ctx))
		}()
		start := time.Now()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				if panicked != nil {
					panic(panicked)
				}
				if ctx.Err() != nil && r.Context().Err() == nil {
					writeError(w, http.StatusServiceUnavailable, a.timedOut(timeout))
					return
				}
				// A dependency's failure answers 503: say which, if it is
				// Redis that fails, before the probes have noticed.
				if tw.code == http.StatusServiceUnavailable {
					if why, down := a.o.Deps.Probe(r.Context(), "redis"); down {
						writeError(w, http.StatusServiceUnavailable, "redis unavailable: "+why)
						return
					}
				}
				tw.copyTo(w)
				return
			case <-tick.C:
				msg := ""
				if why, down := a.o.Deps.Down("redis"); down {
					msg = "redis unavailable: " + why
				} else if why, down := a.o.Deps.Down("nats"); down && time.Since(start) >= natsGrace {
					msg = "nats unavailable: " + why
				}
				if msg != "" {
					tw.abandon(w, msg)
					return
				}
			case <-ctx.Done():
				tw.abandon(w, a.timedOut(timeout))
				return
			}
		}
	})
}

// timedOut says why a request had no answer within timeout: a dependency
// down, or only the time.
func (a *API) timedOut(timeout time.Duration) string {
	if dep := a.o.Deps.First(); dep != "" {
		why, _ := a.o.Deps.Down(dep)
		return dep + " unavailable: " + why
	}
	return fmt.Sprintf("no answer within http.request_timeout (%v)", timeout)
}

// timeoutWriter holds a handler's answer until it is done; once the
// request was answered without it, its writes go nowhere.
type timeoutWriter struct {
	mu        sync.Mutex
	h         http.Header
	buf       bytes.Buffer
	code      int
	abandoned bool
}

func (tw *timeoutWriter) Header() http.Header { return tw.h }

func (tw *timeoutWriter) Write(p []byte) (int, error) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	if tw.abandoned {
		return 0, http.ErrHandlerTimeout
	}
	if tw.code == 0 {
		tw.code = http.StatusOK
	}
	return tw.buf.Write(p)
}

func (tw *timeoutWriter) WriteHeader(code int) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	if !tw.abandoned && tw.code == 0 {
		tw.code = code
	}
}

// copyTo writes the handler's answer to w.
func (tw *timeoutWriter) copyTo(w http.ResponseWriter) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	for k, v := range tw.h {
		w.Header()[k] = v
	}
	w.WriteHeader(max(tw.code, http.StatusOK))
	_, _ = w.Write(tw.buf.Bytes())
}

// abandon answers 503 with msg in place of the handler, which may still
// write and must not touch its header after this.
func (tw *timeoutWriter) abandon(w http.ResponseWriter, msg string) {
	tw.mu.Lock()
	tw.abandoned = true
	tw.mu.Unlock()
	writeError(w, http.StatusServiceUnavailable, msg)
}
