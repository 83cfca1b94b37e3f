package alarm

import (
	"context"
	"fmt"
	"strconv"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// After Redis lost data, the storms come back from the durable registry,
// where every storm transition and scope alarm state is written before it
// is announced (flushStorm, persist): the storm states, their scope alarms
// (repeating where they were), and the scopes' lost sets rebuilt from the
// devices restored lost. A held device alarm then finds its storm, and the
// devices coming back end it once.

// RestoreStorms puts back the scopes' lost sets from lost (the devices
// restored lost, with their group and lost deadline), then every storm
// and scope alarm the registry kept, unless Redis holds a later one.
func (a *Alarms) RestoreStorms(ctx context.Context, lost []dispatch.DeviceRecord) error {
	if !a.stormsOn() {
		return nil
	}
	if err := a.restoreLostSets(ctx, lost); err != nil {
		return err
	}
	if a.opts.Registry == nil {
		return nil
	}
	recs, err := a.opts.Registry.Storms(ctx)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		if rec.State != "" {
			if err := a.putBackStorm(ctx, rec.Scope, rec.State); err != nil {
				return err
			}
		}
		if rec.Alarm != "" {
			if err := a.PutBack(ctx, ScopeAlarmID(rec.Scope), rec.Alarm); err != nil {
				return err
			}
		}
	}
	return nil
}

// restoreLostSets adds each lost device to the lost sets of its scopes at
// its lost deadline (a later one Redis holds stays). A device whose lost
// mark the restore cleared (it signalled after its loss, in data Redis
// kept) is left out: its recovery is on its way.
func (a *Alarms) restoreLostSets(ctx context.Context, lost []dispatch.DeviceRecord) error {
	const page = 1000
	for lo := 0; lo < len(lost); lo += page {
		recs := lost[lo:min(lo+page, len(lost))]
		ids := make([]string, len(recs))
		for j, r := range recs {
			ids[j] = r.ID
		}
		marks, err := a.store.LostMarks().Of(ctx, ids)
		if err != nil {
			return fmt.Errorf("alarm: restore storm losses: %w", err)
		}
		var cmds []shard.Cmd
		for j, r := range recs {
			if marks[j] < r.LostDeadline {
				continue
			}
			for _, sc := range scopesOf(r.Group) {
				cmds = append(cmds, shard.Cmd{Name: "ZADD", Keys: []string{a.stormLostKey(sc)},
					Args: []string{"GT", strconv.FormatInt(r.LostDeadline, 10), r.ID}})
			}
		}
		for _, r := range a.store.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return fmt.Errorf("alarm: restore storm losses: %w", err)
			}
		}
	}
	return nil
}

// putBackStorm writes raw as scope sc's storm state unless Redis holds a
// later one. Transitions it still holds unsent are sent by the scope
// alarm's timer, armed for now.
func (a *Alarms) putBackStorm(ctx context.Context, sc, raw string) error {
	st, err := parseStorm(raw)
	if err != nil {
		return err
	}
	for attempt := 0; attempt < casAttempts; attempt++ {
		old, err := a.readStorm(ctx, sc)
		if err != nil {
			return err
		}
		if old != "" && stateVersion(old) >= st.Version {
			return nil
		}
		now := a.opts.Now()
		if len(st.Pending) > 0 {
			if err := a.putBackTimer(ctx, ScopeAlarmID(sc), now.UnixMilli(), now); err != nil {
				return err
			}
		}
		ok, err := a.swapStorm(ctx, sc, old, raw, now.UnixMilli())
		if err != nil {
			return err
		}
		if ok {
			a.rememberStorm(sc, st)
			return nil
		}
	}
	return fmt.Errorf("%w: storm %s", errContended, sc)
}
