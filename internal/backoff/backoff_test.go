package backoff

import (
	"context"
	"testing"
	"time"
)

// Delays double from Base up to Max, each jittered into [d/2, d].
func TestDelayDoublesUpToTheCap(t *testing.T) {
	p := Policy{Base: 10 * time.Millisecond, Max: time.Second}
	for attempt, want := range []time.Duration{
		10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond,
		160 * time.Millisecond, 320 * time.Millisecond, 640 * time.Millisecond, time.Second, time.Second,
	} {
		for range 100 {
			if got := p.Delay(attempt); got < want/2 || got > want {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", attempt, got, want/2, want)
			}
		}
	}
	// A huge attempt number stays at the cap instead of overflowing.
	if got := p.Delay(1 << 30); got < time.Second/2 || got > time.Second {
		t.Errorf("Delay(1<<30) = %v, want within [500ms, 1s]", got)
	}
	// A cap below the base means the base.
	if got := (Policy{Base: time.Second}).Delay(5); got < time.Second/2 || got > time.Second {
		t.Errorf("Delay with no cap = %v, want within [500ms, 1s]", got)
	}
}

// Next grows with each failure and Reset starts over.
func TestBackoffCountsFailures(t *testing.T) {
	b := Backoff{Policy: Policy{Base: 100 * time.Millisecond, Max: 10 * time.Second}}
	b.Next()
	b.Next()
	if got := b.Next(); got < 200*time.Millisecond || got > 400*time.Millisecond {
		t.Errorf("third Next = %v, want within [200ms, 400ms]", got)
	}
	b.Reset()
	if got := b.Next(); got < 50*time.Millisecond || got > 100*time.Millisecond {
		t.Errorf("Next after Reset = %v, want within [50ms, 100ms]", got)
	}
}

// Wait reports whether it waited the whole delay: false as soon as its
// context ends, and at once for a context already done.
func TestWaitEndsWithItsContext(t *testing.T) {
	if !Wait(context.Background(), time.Millisecond) {
		t.Errorf("Wait(1ms) = false with a live context, want true")
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if Wait(done, 0) {
		t.Errorf("Wait on a done context = true, want false")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	start := time.Now()
	if Wait(ctx, time.Hour) {
		t.Errorf("Wait(1h) = true although its context ended, want false")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Wait took %v after its context ended, want it to return promptly", d)
	}
	b := Backoff{Policy: Policy{Base: time.Hour}}
	if b.Wait(done) {
		t.Errorf("Backoff.Wait on a done context = true, want false")
	}
}
