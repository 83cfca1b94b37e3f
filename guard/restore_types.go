package guard

import (
	"context"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// restoreTypes puts back the thresholds set at run time per device type,
// before any device is re-armed: a device gets a full threshold of its
// type as it was set, not as the configuration says. The process's
// thresholds read them at once.
func (g *Guard) restoreTypes(ctx context.Context, s *shard.Store) error {
	recs, err := g.o.Registry.Types(ctx)
	if err != nil {
		return fmt.Errorf("guard: restore type thresholds: %w", err)
	}
	types := make(map[string]shard.TypeSetting, len(recs))
	for _, r := range recs {
		types[r.Type] = shard.TypeSetting{Threshold: time.Duration(r.Threshold) * time.Millisecond,
			Confirm: time.Duration(r.Confirm) * time.Millisecond, ConfirmSet: r.ConfirmSet}
	}
	if err := s.RestoreTypeSettings(ctx, types); err != nil {
		return err
	}
	if g.o.Thresholds != nil {
		return g.o.Thresholds.Refresh(ctx)
	}
	return nil
}
