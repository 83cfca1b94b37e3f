package periodic_test

import (
	"context"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/periodic"
)

// TestRunCallsUntilDone proves Run calls f with increasing tick times and
// returns once ctx is done.
func TestRunCallsUntilDone(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var ticks []time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		periodic.Run(ctx, time.Millisecond, func(now time.Time) {
			ticks = append(ticks, now)
			if len(ticks) >= 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return 10s after its context ended")
	}
	if len(ticks) < 3 {
		t.Fatalf("got %d calls, want at least 3", len(ticks))
	}
	for i := 1; i < len(ticks); i++ {
		if !ticks[i].After(ticks[i-1]) {
			t.Fatalf("got tick %d at %v, not after tick %d at %v", i, ticks[i], i-1, ticks[i-1])
		}
	}
}

// TestRunReturnsWhenDoneBefore proves Run returns at once, without calling
// f, when ctx has already ended.
func TestRunReturnsWhenDoneBefore(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	periodic.Run(ctx, time.Hour, func(time.Time) { t.Error("f called after ctx ended") })
}
