package shard

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// bounded is the client under every Store: Do and DoMulti return by their
// context's deadline, whatever the connection does. rueidis honours a
// deadline on a connection that stands, but while it reconnects to a hung
// Redis every caller waits for the one dial under way, whose handshake is
// bounded by the dialing caller's deadline or the dial timeout (5s), not by
// the waiter's: 4.5s past a 500ms deadline was measured. A call given up on
// has an unknown outcome, as any call past its deadline; when the dial is
// done its context has ended, so it is almost always not sent.
type bounded struct {
	rueidis.Client
	late *atomic.Int64 // the longest any call returned past its deadline
}

func newBounded(c rueidis.Client) bounded {
	if b, ok := c.(bounded); ok {
		return b
	}
	return bounded{Client: c, late: new(atomic.Int64)}
}

func (b bounded) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	dl, ok := ctx.Deadline()
	if !ok {
		return b.Client.Do(ctx, cmd)
	}
	defer b.note(dl)
	res := make(chan rueidis.RedisResult, 1)
	go func() { res <- b.Client.Do(ctx, cmd) }()
	select {
	case r := <-res:
		return r
	case <-ctx.Done():
	}
	select {
	case r := <-res: // an answer that came with the deadline counts
		return r
	default:
		return rueidis.NewErrorResult(ctx.Err())
	}
}

func (b bounded) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	dl, ok := ctx.Deadline()
	if !ok || len(multi) == 0 {
		return b.Client.DoMulti(ctx, multi...)
	}
	defer b.note(dl)
	res := make(chan []rueidis.RedisResult, 1)
	go func() { res <- b.Client.DoMulti(ctx, multi...) }()
	select {
	case r := <-res:
		return r
	case <-ctx.Done():
	}
	select {
	case r := <-res:
		return r
	default:
	}
	out := make([]rueidis.RedisResult, len(multi))
	for j := range out {
		out[j] = rueidis.NewErrorResult(ctx.Err())
	}
	return out
}

// note records how long past dl a call returned.
func (b bounded) note(dl time.Time) {
	over := int64(time.Since(dl))
	for {
		was := b.late.Load()
		if over <= was || b.late.CompareAndSwap(was, over) {
			return
		}
	}
}

// LongestOverrun is the longest any call of s (and of the stores sharing
// its connection) returned past its context's deadline: the scheduling
// margin only, since every call returns by its deadline.
func (s *Store) LongestOverrun() time.Duration { return time.Duration(s.c.(bounded).late.Load()) }
