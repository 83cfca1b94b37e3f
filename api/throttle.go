package api

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// throttle slows failed authentication per client address: after free
// failures within window, each further failure from the address is
// answered no sooner than step after the one before it, so a guesser gets
// a few answers a second however many requests it sends at once. One
// that would wait longer than maxWait is answered 429 at once. Requests
// with a good token are never held, from any address.
type throttle struct {
	free    int
	step    time.Duration
	maxWait time.Duration
	window  time.Duration
	now     func() time.Time

	mu   sync.Mutex
	addr map[string]*strikes
}

type strikes struct {
	n          int
	next, last time.Time
}

// pruneAt bounds the addresses kept: past it, quiet ones are forgotten.
const pruneAt = 10_000

func newThrottle() *throttle {
	return &throttle{free: 10, step: 200 * time.Millisecond, maxWait: 5 * time.Second, window: time.Minute,
		now: time.Now, addr: map[string]*strikes{}}
}

// failed records a failure from r's address and says how long to hold its
// answer, or false when the address is over its bound and gets 429 now.
func (t *throttle) failed(r *http.Request) (time.Duration, bool) {
	ip := clientIP(r)
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.addr) >= pruneAt {
		for k, s := range t.addr {
			if now.Sub(s.last) > t.window {
				delete(t.addr, k)
			}
		}
	}
	s := t.addr[ip]
	if s == nil || now.Sub(s.last) > t.window {
		s = &strikes{}
		t.addr[ip] = s
	}
	s.last = now
	s.n++
	if s.n <= t.free {
		return 0, true
	}
	at := now
	if s.next.After(now) {
		at = s.next
	}
	wait := at.Sub(now)
	if wait > t.maxWait {
		return 0, false
	}
	s.next = at.Add(t.step)
	return wait, true
}

// hold waits d unless ctx ends first.
func hold(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}

// clientIP is the address a request came from. Forwarded headers are not
// trusted: behind a proxy every client shares the proxy's address.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
