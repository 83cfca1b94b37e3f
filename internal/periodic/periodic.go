package periodic

import (
	"context"
	"time"
)

// Run calls f with the tick time every period until ctx is done, and
// returns then. The first call comes one period after Run starts. Calls
// never overlap: a call that overruns its period delays the next, and the
// ticks missed meanwhile are dropped, as time.Ticker drops them. every
// must be positive.
func Run(ctx context.Context, every time.Duration, f func(now time.Time)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			f(now)
		}
	}
}
