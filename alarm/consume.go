package alarm

import (
	"context"

	"github.com/sigwatch/sigwatch/dispatch"
)

// consumerOptions shape the durable consumer every replica shares.
func (a *Alarms) consumerOptions() dispatch.ConsumerOptions {
	return dispatch.ConsumerOptions{Durable: a.opts.Consumer, Description: "sigwatch alarm workers",
		AckWait: a.opts.AckWait, Workers: a.opts.Workers}
}

// events is the alarms' handler of lost and recovered events.
type events struct{ a *Alarms }

// Lost raises an alarm for a lost device, unless it has signalled again
// since (or damps it into flapping).
func (e events) Lost(ctx context.Context, ev dispatch.Lost) error {
	a := e.a
	fence, err := a.notes.Take(ctx)
	if err != nil {
		return err
	}
	cur, err := a.current(ctx, ev.Device)
	if err != nil {
		return err
	}
	if a.stormsOn() {
		// Counted before the alarm is decided, so that the storm this
		// loss completes holds it.
		if err := a.stormLoss(ctx, ev, cur, fence); err != nil {
			return err
		}
	}
	now := a.opts.Now()
	m := a.deviceMachine(ev.Device, ev.Type, now)
	m.lastSeen = ev.LastSeen
	var changed bool
	_, err = a.apply(ctx, ev.Device, now, fence, func(st *State) (bool, error) {
		changed = m.lost(st, ev.Deadline, ev.Type, cur)
		if changed && ev.Group != st.Group {
			st.Group = ev.Group
		}
		return changed, nil
	})
	if err == nil {
		a.m.handled("lost", changed)
	}
	return err
}

// Recovered resolves the alarm of a device that signalled again.
func (e events) Recovered(ctx context.Context, ev dispatch.Recovered) error {
	a := e.a
	fence, err := a.notes.Take(ctx)
	if err != nil {
		return err
	}
	now := a.opts.Now()
	m := a.machine(ev.Device, now)
	var changed bool
	// The device leaves the storms of the group it was lost under and of
	// the one it is back under: it may have roamed meanwhile.
	groups := []string{ev.Group}
	_, err = a.apply(ctx, ev.Device, now, fence, func(st *State) (bool, error) {
		groups = append(groups[:1], st.Group)
		changed = m.recovered(st, ev.LostAt, ev.Type)
		return changed, nil
	})
	if err == nil && a.stormsOn() {
		err = a.stormBack(ctx, groups, ev.Device, fence)
	}
	if err == nil {
		a.m.handled("recovered", changed)
	}
	return err
}
