package queue

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// drain performs the drain duties of this replica every DrainCheck while a
// doubling drains, until ctx is done. Run owns the goroutine and waits for
// it before it stops the shard loops.
func (e *Engine) drain(ctx context.Context) {
	tick := time.NewTicker(e.opts.DrainCheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			e.m.drainMoved.Set(0)
			return
		case <-tick.C:
		}
		if err := e.drainStep(ctx); err != nil && ctx.Err() == nil {
			e.warn.Warn(e.log, "drain", "drain check failed; retrying", "err", err)
		}
	}
}

// drainStep checks the old shards this replica owns (see shard.Double for
// the steps of a doubling): once every live writer writes with the current
// epoch it raises each one's floor, then counts the moved members left and
// reports them; a shard counted clean after its floor was raised is
// drained. The owner of shard 0 then tries to end the doubling. Every duty
// is idempotent, so a check by an owner that has just lost its lease is
// harmless.
func (e *Engine) drainStep(ctx context.Context) error {
	t := e.topo.Current()
	var old []int
	if t.Draining() {
		for _, i := range e.Owned() {
			if i < t.Prev {
				old = append(old, i)
			}
		}
	}
	if len(old) == 0 {
		e.m.drainMoved.Set(0)
		return nil
	}
	now := e.opts.Now()
	writers, err := e.store.Writers(ctx)
	if err != nil {
		return fmt.Errorf("queue: drain: %w", err)
	}
	current, lagging := shard.WritersCurrent(writers, t.Epoch, now)
	if !current && now.Sub(time.UnixMilli(t.Since)) > shard.WriterTimeout {
		e.warn.Warn(e.log, "drain-lagging", "doubling waits for writers still on an older topology",
			"epoch", t.Epoch, "lagging", lagging)
	}
	var total int64
	for _, i := range old {
		if current {
			if err := e.store.RaiseFloor(ctx, i, t.Epoch); err != nil {
				return fmt.Errorf("queue: drain: %w", err)
			}
		}
		moved, err := e.store.CountMoved(ctx, i, t.Shards, false)
		if err != nil {
			return fmt.Errorf("queue: drain: %w", err)
		}
		r := shard.DrainState{Epoch: t.Epoch, Moved: moved, Floored: current, At: now.UnixMilli()}
		if err := e.store.RecordDrain(ctx, i, r); err != nil {
			return fmt.Errorf("queue: drain: %w", err)
		}
		total += moved
	}
	e.m.drainMoved.Set(float64(total))
	if !slices.Contains(old, 0) {
		return nil
	}
	done, err := e.store.FinishDoubling(ctx, t.Epoch, now)
	if err != nil {
		return fmt.Errorf("queue: drain: %w", err)
	}
	if done {
		e.log.Info("doubling finished: every old shard is drained", "shards", t.Shards, "from", t.Prev, "epoch", t.Epoch+1,
			"took", now.Sub(time.UnixMilli(t.Since)).Round(time.Second))
		if _, err := e.topo.Refresh(ctx); err != nil {
			return fmt.Errorf("queue: drain: %w", err)
		}
		e.m.drainMoved.Set(0)
	}
	return nil
}
