package alarm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sync/errgroup"

	"github.com/sigwatch/sigwatch/dispatch"
)

// Storm detection: each loss and recovery is counted in its scopes, and a
// count that crosses the scope's threshold makes a transition, stored by
// compare-and-set and then carried out (see storm.go).

// stormLoss counts the loss of ev in its scopes and starts the storms it
// completes. A device already back leaves the scopes instead, and so does
// one found back once its loss is counted: its recovery may have been
// handled between the two (another worker), and would have taken out
// nothing.
func (a *Alarms) stormLoss(ctx context.Context, ev dispatch.Lost, current int64, fence dispatch.Fence) error {
	scopes := scopesOf(ev.Group)
	if current > ev.Deadline {
		return a.stormBack(ctx, []string{ev.Group}, ev.Device, fence)
	}
	w := a.window(ev.Device, ev.Type).Milliseconds()
	counts, err := a.countLoss(ctx, scopes, ev.Device, ev.Deadline, ev.Deadline-w)
	if err != nil {
		return err
	}
	after, err := a.current(ctx, ev.Device)
	if err != nil {
		return err
	}
	if after > ev.Deadline {
		return a.stormBack(ctx, []string{ev.Group}, ev.Device, fence)
	}
	for j, sc := range scopes {
		c := counts[j]
		_, watched, ok, err := a.consider(ctx, sc, c, false)
		if err != nil {
			return err
		}
		if !ok || watched == 0 || c.recent < a.opts.Storm.need(sc, watched) {
			continue
		}
		hold := a.hold(ev.Device, ev.Type).Milliseconds()
		err = a.stormTransition(ctx, sc, fence, func(st *stormState, now int64) bool {
			if st.Active {
				return false
			}
			st.Active, st.Since, st.From, st.Devices, st.Watched, st.Type, st.Hold = true, now, ev.Deadline-w, c.recent, watched, ev.Type, hold
			st.Pending = append(st.Pending, a.stormEvent(sc, st, StormStarted, now))
			return true
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// stormBack takes device id out of the lost devices of the scopes of
// groups (the group it was lost under, and the one it came back under if
// it roamed) and ends the storms that fall below their threshold — also a
// group's whose devices all roamed away: a storm ends when the devices it
// counts are back, wherever they are now.
func (a *Alarms) stormBack(ctx context.Context, groups []string, id string, fence dispatch.Fence) error {
	var scopes []string
	for _, g := range groups {
		for _, sc := range scopesOf(g) {
			if !slices.Contains(scopes, sc) {
				scopes = append(scopes, sc)
			}
		}
	}
	counts, err := a.countBack(ctx, scopes, id)
	if err != nil {
		return err
	}
	for j, sc := range scopes {
		st, watched, ok, err := a.consider(ctx, sc, counts[j], true)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		left, err := a.lostSince(ctx, sc, st.From)
		if err != nil {
			return err
		}
		if left >= a.opts.Storm.need(sc, watched) {
			continue
		}
		err = a.stormTransition(ctx, sc, fence, func(st *stormState, now int64) bool {
			if !st.Active {
				return false
			}
			st.Active, st.Ended, st.Devices, st.Watched = false, now, left, watched
			st.Pending = append(st.Pending, a.stormEvent(sc, st, StormEnded, now))
			return true
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// consider reads the storm of scope sc from c and, when it is in the phase
// a transition could leave (going on if active, else not: ok), the scope's
// watched devices.
func (a *Alarms) consider(ctx context.Context, sc string, c stormCount, active bool) (st stormState, watched int64, ok bool, err error) {
	st, err = parseStorm(c.state)
	if err != nil || st.Active != active {
		return st, 0, false, err
	}
	watched, err = a.watched(ctx, sc)
	return st, watched, err == nil, err
}

func (a *Alarms) stormEvent(sc string, st *stormState, state string, now int64) dispatch.Storm {
	scope, group := scopeName(sc)
	return dispatch.Storm{ID: StormID(sc, st.Since, state), Scope: scope, Group: group, State: state,
		Devices: st.Devices, Watched: st.Watched, Since: st.Since, At: now}
}

// stormTransition applies decide to scope sc's storm with compare-and-set
// until it sticks, then carries out what it decided. The scope alarm's
// timer is armed first, so that a crash before the notifications are out
// leaves a timer that sends them. What it decided goes out under fence.
func (a *Alarms) stormTransition(ctx context.Context, sc string, fence dispatch.Fence, decide func(st *stormState, now int64) bool) error {
	for attempt := 0; attempt < casAttempts; attempt++ {
		raw, err := a.readStorm(ctx, sc)
		if err != nil {
			return err
		}
		st, err := parseStorm(raw)
		if err != nil {
			return err
		}
		now := a.opts.Now()
		next := st
		next.Pending = append([]dispatch.Storm(nil), st.Pending...)
		if !decide(&next, now.UnixMilli()) {
			return nil
		}
		next.Version++
		if err := a.arm(ctx, ScopeAlarmID(sc), now.Add(pendingRetry).UnixMilli(), now); err != nil {
			return err
		}
		b, err := json.Marshal(next)
		if err != nil {
			return err
		}
		ok, err := a.swapStorm(ctx, sc, raw, string(b), now.UnixMilli())
		if err != nil {
			return err
		}
		if ok {
			a.rememberStorm(sc, next)
			a.m.stormTransition(next)
			return a.flushStorm(ctx, sc, fence)
		}
	}
	return fmt.Errorf("%w: storm %s", errContended, sc)
}

// flushStorm carries out the pending transitions of scope sc's storm, in
// order: its event, its alarm's raise or resolve, and at an end the wake of
// the devices still lost. Each step is idempotent, so a replica that
// repeats them after a crash, or races another, does each once. Its event
// and its alarm's notifications go out under fence, taken before the
// storm's state was read.
func (a *Alarms) flushStorm(ctx context.Context, sc string, fence dispatch.Fence) error {
	for attempt := 0; attempt < casAttempts; attempt++ {
		raw, err := a.readStorm(ctx, sc)
		if err != nil {
			return err
		}
		st, err := parseStorm(raw)
		if err != nil || len(st.Pending) == 0 {
			return err
		}
		// What is announced is in the registry first.
		if err := a.persistScope(ctx, sc, raw, ""); err != nil {
			return fmt.Errorf("alarm: keep storm %s before notifying: %w", sc, err)
		}
		if a.opts.BeforeNotify != nil {
			a.opts.BeforeNotify("storm")
		}
		for _, ev := range st.Pending {
			msg, err := dispatch.Encode(a.pub.Subjects(), ev)
			if err != nil {
				return err
			}
			if err := errors.Join(a.pub.PublishFenced(ctx, fence, []dispatch.Message{msg})...); err != nil {
				a.m.publishErrors.Inc()
				return fmt.Errorf("alarm: storm event %s: %w", ev.ID, err)
			}
			if err := a.scopeAlarm(ctx, sc, st, ev, fence); err != nil {
				return err
			}
			if ev.State == StormEnded {
				if err := a.wakeLost(ctx, sc, ev.At+st.Hold); err != nil {
					return err
				}
			}
		}
		next := st
		next.Pending = nil
		next.Version++
		b, err := json.Marshal(next)
		if err != nil {
			return err
		}
		ok, err := a.swapStorm(ctx, sc, raw, string(b), a.opts.Now().UnixMilli())
		if err != nil || ok {
			if ok {
				a.rememberStorm(sc, next)
				// Kept without its sent transitions, which a restore
				// would otherwise send again.
				err = a.persistScope(ctx, sc, string(b), "")
			}
			return err
		}
	}
	return fmt.Errorf("%w: storm %s", errContended, sc)
}

// scopeAlarm raises (at a start) or resolves (at an end) the alarm of
// scope sc for the storm of ev. The alarm is a device alarm without a
// device: its lost deadline is the storm's start.
func (a *Alarms) scopeAlarm(ctx context.Context, sc string, st stormState, ev dispatch.Storm, fence dispatch.Fence) error {
	id := ScopeAlarmID(sc)
	now := a.opts.Now()
	m := a.machine(id, now)
	_, err := a.apply(ctx, id, now, fence, func(s *State) (bool, error) {
		if ev.State == StormStarted {
			return m.lost(s, ev.Since, st.Type, 0), nil
		}
		return m.recovered(s, ev.Since, st.Type), nil
	})
	return err
}

// wakeLost arms the timers of the devices of scope sc still lost at the
// end of its storm for at: each is then raised unless it came back.
func (a *Alarms) wakeLost(ctx context.Context, sc string, at int64) error {
	now := a.opts.Now()
	return a.lostMembers(ctx, sc, func(ids []string) error {
		// Every id is armed, whatever another's error: each is a device
		// to raise.
		var g errgroup.Group
		g.SetLimit(a.opts.Workers)
		errs := make([]error, len(ids))
		for j, id := range ids {
			g.Go(func() error {
				errs[j] = a.arm(ctx, id, at, now)
				return nil
			})
		}
		_ = g.Wait()
		return errors.Join(errs...)
	})
}
