package guard

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// lockKeeper extends the restore lock while a restore runs: a restore
// longer than the lock's TTL (a large registry, many alarm states) keeps it,
// and a second process does not start one beside it.
type lockKeeper struct {
	g     *Guard
	ctx   context.Context
	token string
}

// keep extends the lock now; it fails once another process holds it.
func (k *lockKeeper) keep() error {
	ok, err := k.g.o.Store.ExtendLock(k.ctx, shard.RestoreLock, k.token, k.g.o.RestoreLockTTL)
	if err == nil && !ok {
		err = fmt.Errorf("guard: restore lock lost")
	}
	return err
}

// during extends the lock every third of its time until the returned stop
// is called, and cancels the context it returns once the lock is lost;
// stop reports that loss.
func (k *lockKeeper) during(ctx context.Context) (context.Context, func() error) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	var lost error
	go func() {
		defer close(done)
		t := time.NewTicker(k.g.o.RestoreLockTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := k.keep(); err != nil {
					lost = err
					cancel(err)
					return
				}
			}
		}
	}()
	return ctx, func() error {
		cancel(nil)
		<-done
		if lost != nil {
			return lost
		}
		return k.keep()
	}
}

// restoreAlarmWorkers bounds the alarm states put back at once.
const restoreAlarmWorkers = 16

// restoreAlarms puts back the storms, then the alarm states, several at
// once.
func (g *Guard) restoreAlarms(ctx context.Context, alarms [][2]string, lost []dispatch.DeviceRecord, n *restored) error {
	if g.o.RestoreStorms != nil {
		if err := g.o.RestoreStorms(ctx, lost); err != nil {
			return fmt.Errorf("guard: restore storms: %w", err)
		}
	}
	if g.o.RestoreAlarm == nil {
		return nil
	}
	var eg errgroup.Group
	eg.SetLimit(restoreAlarmWorkers)
	for _, a := range alarms {
		eg.Go(func() error {
			if err := g.o.RestoreAlarm(ctx, a[0], a[1]); err != nil {
				return fmt.Errorf("guard: restore the alarm of %s: %w", a[0], err)
			}
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		return err
	}
	n.Alarms += len(alarms)
	return nil
}
