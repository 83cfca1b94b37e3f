package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// opTimeout bounds one coordinator call to Redis, so a hung call cannot
// hold up lease renewals for longer than a renewal period.
func (e *Engine) opTimeout() time.Duration { return e.opts.LeaseTTL / 3 }

// rebalance heartbeats, computes the desired shards, asks loops of shards no
// longer desired to stop, and acquires the desired shards not yet held.
func (e *Engine) rebalance(ctx, loopCtx context.Context, wg *sync.WaitGroup) {
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout())
	defer cancel()
	live, err := e.store.Heartbeat(ctx, e.opts.Replica, e.opts.Now(), e.opts.LeaseTTL)
	if err != nil {
		if ctx.Err() == nil {
			e.warn.Warn(e.log, "heartbeat", "heartbeat failed; keeping current shards", "err", err)
		}
		return
	}
	slices.Sort(live) // Assign needs the order every replica sees; Heartbeat sorts too.
	desired := shard.Assign(e.topo.Current().Shards, live, e.opts.Replica)

	e.mu.Lock()
	for i, l := range e.loops {
		if !slices.Contains(desired, i) {
			l.requestStop()
		}
	}
	var missing []int
	for _, i := range desired {
		if _, ok := e.loops[i]; !ok {
			missing = append(missing, i)
		}
	}
	e.mu.Unlock()

	leases := make([]*shard.Lease, len(missing))
	sent := time.Now()
	parallel(len(missing), func(j int) {
		l, ok, err := e.store.Acquire(ctx, missing[j], e.opts.Replica, e.opts.LeaseTTL)
		if err != nil {
			if ctx.Err() == nil {
				e.warn.Warn(e.log, "acquire", "lease acquisition failed", "shard", missing[j], "err", err)
			}
			return
		}
		if ok {
			leases[j] = &l
		}
	})
	for _, l := range leases {
		if l != nil {
			e.start(loopCtx, wg, *l, sent)
		}
	}
	e.m.owned.Set(float64(len(e.Owned())))
}

// start runs a shard loop for a freshly acquired lease.
func (e *Engine) start(loopCtx context.Context, wg *sync.WaitGroup, lease shard.Lease, sent time.Time) {
	ctx, cancel := context.WithCancel(loopCtx)
	l := &shardLoop{lease: lease, stop: make(chan struct{}), woke: make(chan struct{}, 1), cancel: cancel}
	l.extend(sent, e.opts.LeaseTTL)
	e.mu.Lock()
	e.loops[lease.Shard] = l
	e.mu.Unlock()
	e.log.Debug("shard acquired", "shard", lease.Shard, "token", lease.Token())
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cancel()
		e.runShard(ctx, l)
		e.mu.Lock()
		if e.loops[lease.Shard] == l {
			delete(e.loops, lease.Shard)
		}
		e.mu.Unlock()
	}()
}

// renew extends every held lease, all in one round trip; a lease found
// lost stops its loop at once.
func (e *Engine) renew(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout())
	defer cancel()
	e.mu.Lock()
	loops := make([]*shardLoop, 0, len(e.loops))
	leases := make([]shard.Lease, 0, len(e.loops))
	for _, l := range e.loops {
		loops = append(loops, l)
		leases = append(leases, l.lease)
	}
	e.mu.Unlock()
	if len(loops) == 0 {
		return
	}
	sent := time.Now()
	for j, err := range e.store.RenewAll(ctx, leases, e.opts.LeaseTTL) {
		l := loops[j]
		switch {
		case err == nil:
			l.extend(sent, e.opts.LeaseTTL)
		case errors.Is(err, shard.ErrNotOwner):
			e.leaseLost(l, "renew")
		case ctx.Err() == nil:
			e.warn.Warn(e.log, "renew", "lease renewal failed", "shard", l.lease.Shard, "err", err)
		}
	}
}

// leaseLost stops l at once: another replica may own its shard now.
func (e *Engine) leaseLost(l *shardLoop, during string) {
	if l.lost.CompareAndSwap(false, true) {
		e.m.leaseLost.Inc()
		e.log.Warn("shard lease lost; stopping its loop", "shard", l.lease.Shard, "during", during)
	}
	l.cancel()
}

// shutdown stops every loop after its in-flight batch, renewing their
// leases meanwhile; loops still busy after a lease time are cancelled (what
// they had not settled stays in Redis and is claimed again). Then the
// replica leaves the membership.
func (e *Engine) shutdown(loopCtx context.Context, cancelLoops context.CancelFunc, wg *sync.WaitGroup, renew <-chan time.Time) {
	e.mu.Lock()
	for _, l := range e.loops {
		l.requestStop()
	}
	e.mu.Unlock()
	done := make(chan struct{})
	go func() { // Ends when the last loop does; cancelLoops below guarantees that.
		wg.Wait()
		close(done)
	}()
	grace := time.NewTimer(e.opts.LeaseTTL)
	defer grace.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-renew:
			e.renew(loopCtx)
		case <-grace.C:
			e.log.Warn("shard loops still busy at shutdown; cancelling them")
			cancelLoops()
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(loopCtx), e.opTimeout())
	defer cancel()
	if err := e.store.Leave(ctx, e.opts.Replica); err != nil {
		e.log.Warn("leaving the membership failed; it expires by itself", "err", err)
	}
	e.m.owned.Set(0)
	e.m.shardSize.Reset()
}

// updateSizes refreshes the shard_size gauge of the owned shards.
func (e *Engine) updateSizes(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout())
	defer cancel()
	owned := e.Owned()
	sizes, errs := e.store.Sizes(ctx, e.opts.Family, owned)
	e.m.shardSize.Reset()
	for j, i := range owned {
		if errs[j] == nil {
			e.m.shardSize.WithLabelValues(fmt.Sprint(i)).Set(float64(sizes[j]))
		}
	}
}

// parallel calls f(0..n-1) concurrently and waits; rueidis pipelines the
// Redis calls they make.
func parallel(n int, f func(j int)) {
	if n == 1 {
		f(0)
		return
	}
	var wg sync.WaitGroup
	for j := range n {
		wg.Go(func() { f(j) })
	}
	wg.Wait()
}
