package main

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// liveness is what GET /healthz answers: whether the process's long-running
// loops still make progress. Each watched role beats whenever its loop reads
// the clock; the scanner and alarm coordinators do so every rebalance period
// (500ms) whatever Redis, NATS or the broker do, because every call they make
// to them is bounded by a timeout. So a beat older than stale means a loop is
// stuck in this process, and a restart helps; a dependency being down is
// readiness's business (/readyz), and restarting pods for it would only add
// to the outage.
type liveness struct {
	start time.Time
	stale time.Duration
	roles map[string]*beat // fixed once Start has wired the roles
}

type beat struct {
	last atomic.Int64 // time.Since(start) of the latest beat, monotonic
	// hold, when set, blocks the beating loop until it is closed: a test
	// seam that stalls a real loop.
	hold atomic.Pointer[chan struct{}]
}

func newLiveness(stale time.Duration) *liveness {
	return &liveness{start: time.Now(), stale: stale, roles: map[string]*beat{}}
}

// wrap returns now, beating for role at each call. It is called while Start
// wires the roles, before any of them runs.
func (l *liveness) wrap(role string, now func() time.Time) func() time.Time {
	b := &beat{}
	b.last.Store(int64(time.Since(l.start)))
	l.roles[role] = b
	return func() time.Time {
		if h := b.hold.Load(); h != nil {
			<-*h
		}
		b.last.Store(int64(time.Since(l.start)))
		return now()
	}
}

// stalled lists the roles that have not beaten for longer than stale, with
// how long, sorted by role.
func (l *liveness) stalled() []string {
	now := time.Since(l.start)
	var out []string
	for role, b := range l.roles {
		if d := now - time.Duration(b.last.Load()); d > l.stale {
			out = append(out, fmt.Sprintf("%s (no progress for %s)", role, d.Round(time.Second)))
		}
	}
	slices.Sort(out)
	return out
}

// stall blocks role's loop at its next beat until the returned func is
// called (tests only).
func (l *liveness) stall(role string) (release func()) {
	ch := make(chan struct{})
	l.roles[role].hold.Store(&ch)
	return func() {
		l.roles[role].hold.Store(nil)
		close(ch)
	}
}

func (a *App) healthz(w http.ResponseWriter, r *http.Request) {
	if s := a.live.stalled(); len(s) > 0 {
		http.Error(w, "stalled: "+strings.Join(s, ", "), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}
