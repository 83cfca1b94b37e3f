package dispatch

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/semaphore"
)

// inflight bounds the asynchronous publishes of a publisher (events and
// registry writes share its JetStream client) to MaxPending. A caller takes
// room for its whole batch before it publishes and gives each slot back once
// that publish is acknowledged or failed, so a batch never holds part of the
// room while it waits for the rest, and more batches than fit (more shard
// loops than the room was sized for, or several families firing at once)
// wait their turn instead of failing with the client's "too many
// outstanding async published messages".
type inflight struct {
	sem *semaphore.Weighted
	max int
}

func newInflight(max int) *inflight {
	return &inflight{sem: semaphore.NewWeighted(int64(max)), max: max}
}

// acquire waits for room for n publishes, at most g.max.
func (g *inflight) acquire(ctx context.Context, n int) error {
	return g.sem.Acquire(ctx, int64(n))
}

// release gives back the room of n publishes that are settled, and that of
// the futures still pending once each settles (the client times them out
// after its AckWait, so every one does).
func (g *inflight) release(n int, pending []jetstream.PubAckFuture) {
	if n > 0 {
		g.sem.Release(int64(n))
	}
	if len(pending) == 0 {
		return
	}
	go func() {
		for _, f := range pending {
			select {
			case <-f.Ok():
			case <-f.Err():
			}
			g.sem.Release(1)
		}
	}()
}
