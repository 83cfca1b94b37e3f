package ingest

import (
	"context"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/backoff"
)

// An event ingest publishes (recovered, invalid) is tried publishAttempts
// times, each waiting at most publishWait, with publishBackoff between
// attempts, before it is logged as lost: NATS being down must not stop
// ingest.
const (
	publishAttempts = 3
	publishWait     = 2 * time.Second
)

var publishBackoff = backoff.Policy{Base: 160 * time.Millisecond, Max: time.Second}

// publishEvents publishes msgs, retrying the failed ones, and returns the errors
// of the last attempt.
func publishEvents(ctx context.Context, pub *dispatch.Bus, msgs []dispatch.Message) []error {
	errs := make([]error, len(msgs))
	todo := make([]int, len(msgs))
	for j := range todo {
		todo[j] = j
	}
	for attempt := 0; attempt < publishAttempts && len(todo) > 0; attempt++ {
		if attempt > 0 && !backoff.Wait(ctx, publishBackoff.Delay(attempt-1)) {
			break
		}
		batch := make([]dispatch.Message, len(todo))
		for k, j := range todo {
			batch[k] = msgs[j]
		}
		pctx, cancel := context.WithTimeout(ctx, publishWait)
		res := pub.Publish(pctx, batch)
		cancel()
		var again []int
		for k, j := range todo {
			if errs[j] = res[k]; errs[j] != nil {
				again = append(again, j)
			}
		}
		todo = again
	}
	return errs
}
