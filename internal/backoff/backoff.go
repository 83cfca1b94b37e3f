package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy is an exponential back-off: Base doubling with each attempt up to
// Max. Every delay is jittered into [d/2, d] ("equal jitter"), so that loops
// failing together do not retry in step, and is never below Base/2.
type Policy struct {
	Base time.Duration // the delay before the first retry, before jitter
	Max  time.Duration // the cap, before jitter; Max < Base means Base
}

// Delay returns the wait before retry attempt+1: attempt 0 is the first
// failure.
func (p Policy) Delay(attempt int) time.Duration {
	d := max(p.Base, 1)
	ceiling := max(p.Max, d)
	for i := 0; i < attempt && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	return d/2 + rand.N(d/2+1)
}

// Backoff counts the consecutive failures of one loop. The zero value with
// a Policy set is ready to use; it is not safe for concurrent use.
type Backoff struct {
	Policy
	attempt int
}

// Next returns the wait after one more failure.
func (b *Backoff) Next() time.Duration {
	d := b.Delay(b.attempt)
	b.attempt++
	return d
}

// Reset starts over after a success.
func (b *Backoff) Reset() { b.attempt = 0 }

// Wait sleeps the wait after one more failure, and reports false if ctx
// ended first.
func (b *Backoff) Wait(ctx context.Context) bool { return Wait(ctx, b.Next()) }

// Wait sleeps d, and reports false if ctx ended first (or had ended).
func Wait(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
