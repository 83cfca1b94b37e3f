package liveness

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// Liveness holds the latest beats of each watched role.
type Liveness struct {
	start time.Time
	stale atomic.Int64       // a time.Duration
	roles map[string][]*beat // fixed once Start has wired the roles
}

// minStale is the shortest stale limit. Every Redis call returns by its
// deadline, even while the client reconnects to a hung Redis (shard's
// bounded client), and every call the watched loops make has one (the
// coordinators' a third of the lease, ingest's 3s), so a loop goes a few
// seconds without a beat at worst whatever Redis, NATS or the broker do:
// about 4s was measured with Redis hung for 30s under signals (ingest's
// flush retrying), where the alarm loop went 20s before the calls were
// bounded.
const minStale = 15 * time.Second

type beat struct {
	last atomic.Int64 // time.Since(start) of the latest beat, monotonic
	// hold, when set, blocks the beating loop until it is closed: a test
	// seam that stalls a real loop.
	hold atomic.Pointer[chan struct{}]
}

// New returns a Liveness whose loops are stalled after stale without a
// beat (at least minStale).
func New(stale time.Duration) *Liveness {
	l := &Liveness{start: time.Now(), roles: map[string][]*beat{}}
	l.stale.Store(int64(max(stale, minStale)))
	return l
}

// Wrap returns now, beating for role at each call. It is called while Start
// wires the roles, before any of them runs.
func (l *Liveness) Wrap(role string, now func() time.Time) func() time.Time {
	beat := l.Beat(role)
	return func() time.Time {
		beat()
		return now()
	}
}

// Beat adds a loop to role and returns its beat, to be called at each turn
// of that loop. A role of several loops is as old as its oldest beat, so
// one of them stuck is seen while the others go on. It is called while
// Start wires the roles, before any of them runs.
func (l *Liveness) Beat(role string) func() {
	b := &beat{}
	b.last.Store(int64(time.Since(l.start)))
	l.roles[role] = append(l.roles[role], b)
	return func() {
		if h := b.hold.Load(); h != nil {
			<-*h
		}
		b.last.Store(int64(time.Since(l.start)))
	}
}

// Ages returns how long ago each role last beat: its oldest loop's.
func (l *Liveness) Ages() map[string]time.Duration {
	now := time.Since(l.start)
	out := make(map[string]time.Duration, len(l.roles))
	for role, bs := range l.roles {
		for _, b := range bs {
			out[role] = max(out[role], now-time.Duration(b.last.Load()))
		}
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

// Stall blocks role's loops at their next beat until the returned func is
// called (tests only).
func (l *Liveness) Stall(role string) (release func()) {
	ch := make(chan struct{})
	for _, b := range l.roles[role] {
		b.hold.Store(&ch)
	}
	return func() {
		for _, b := range l.roles[role] {
			b.hold.Store(nil)
		}
		close(ch)
	}
}

// Stale is the limit past which a loop without a beat is stalled.
func (l *Liveness) Stale() time.Duration { return time.Duration(l.stale.Load()) }

// SetStale changes the limit, below minStale too (tests only).
func (l *Liveness) SetStale(d time.Duration) { l.stale.Store(int64(d)) }
