package liveness

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// Liveness holds the latest beat of each watched role.
type Liveness struct {
	start time.Time
	stale atomic.Int64     // a time.Duration
	roles map[string]*beat // fixed once Start has wired the roles
}

// minStale is the shortest stale limit. A coordinator's Redis calls are
// bounded by their own timeouts, but while the client reconnects to a hung
// Redis every caller waits for the dial and handshake (rueidis: up to a 5s
// dial plus a 10s reply timeout), and one coordinator pass makes a few
// calls: gaps of 6-20s were measured with Redis hung. A loop waiting that
// long is slow, not stuck.
const minStale = 60 * time.Second

type beat struct {
	last atomic.Int64 // time.Since(start) of the latest beat, monotonic
	// hold, when set, blocks the beating loop until it is closed: a test
	// seam that stalls a real loop.
	hold atomic.Pointer[chan struct{}]
}

// New returns a Liveness whose loops are stalled after stale without a
// beat (at least minStale).
func New(stale time.Duration) *Liveness {
	l := &Liveness{start: time.Now(), roles: map[string]*beat{}}
	l.stale.Store(int64(max(stale, minStale)))
	return l
}

// Wrap returns now, beating for role at each call. It is called while Start
// wires the roles, before any of them runs.
func (l *Liveness) Wrap(role string, now func() time.Time) func() time.Time {
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

// Ages returns how long ago each role last beat.
func (l *Liveness) Ages() map[string]time.Duration {
	now := time.Since(l.start)
	out := make(map[string]time.Duration, len(l.roles))
	for role, b := range l.roles {
		out[role] = now - time.Duration(b.last.Load())
	}
	return out
}

// Stalled lists the roles that have not beaten for longer than stale, with
// how long, sorted by role.
func (l *Liveness) Stalled() []string {
	stale := time.Duration(l.stale.Load())
	var out []string
	for role, d := range l.Ages() {
		if d > stale {
			out = append(out, fmt.Sprintf("%s (no progress for %s)", role, d.Round(time.Second)))
		}
	}
	slices.Sort(out)
	return out
}

// Stall blocks role's loop at its next beat until the returned func is
// called (tests only).
func (l *Liveness) Stall(role string) (release func()) {
	ch := make(chan struct{})
	l.roles[role].hold.Store(&ch)
	return func() {
		l.roles[role].hold.Store(nil)
		close(ch)
	}
}

// Stale is the limit past which a loop without a beat is stalled.
func (l *Liveness) Stale() time.Duration { return time.Duration(l.stale.Load()) }

// SetStale changes the limit, below minStale too (tests only).
func (l *Liveness) SetStale(d time.Duration) { l.stale.Store(int64(d)) }
