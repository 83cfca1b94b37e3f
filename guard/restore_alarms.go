package guard

import (
	"context"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// lockKeeper extends the restore lock while a restore runs.
type lockKeeper struct {
	g     *Guard
	ctx   context.Context
	token string
	at    time.Time // when the lock was last extended
}

// keep extends the lock now; it fails once another process holds it.
func (k *lockKeeper) keep() error {
	ok, err := k.g.o.Store.ExtendLock(k.ctx, shard.RestoreLock, k.token, k.g.o.RestoreLockTTL)
	if err == nil && !ok {
		err = fmt.Errorf("guard: restore lock lost")
	}
	k.at = time.Now()
	return err
}

// every extends the lock once a third of its time has passed since it was
// last extended, so that no slow step lets it lapse.
func (k *lockKeeper) every() error {
	if time.Since(k.at) < k.g.o.RestoreLockTTL/3 {
		return nil
	}
	return k.keep()
}

// restoreAlarms puts back the storms, then the alarm states, one by one,
// extending the restore lock as it goes.
func (g *Guard) restoreAlarms(ctx context.Context, alarms [][2]string, lost []dispatch.DeviceRecord, lk *lockKeeper, n *restored) error {
	if g.o.RestoreStorms != nil {
		if err := g.o.RestoreStorms(ctx, lost); err != nil {
			return fmt.Errorf("guard: restore storms: %w", err)
		}
		if err := lk.keep(); err != nil {
			return err
		}
	}
	if g.o.RestoreAlarm == nil {
		return nil
	}
	for _, a := range alarms {
		if err := g.o.RestoreAlarm(ctx, a[0], a[1]); err != nil {
			return fmt.Errorf("guard: restore the alarm of %s: %w", a[0], err)
		}
		n.Alarms++
		if err := lk.every(); err != nil {
			return err
		}
	}
	return nil
}
