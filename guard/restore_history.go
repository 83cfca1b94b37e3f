package guard

import (
	"context"
	"fmt"

	"github.com/sigwatch/sigwatch/dispatch"
)

// loss is what the event stream says of one device's losses.
type loss struct {
	lost, at int64 // the latest deadline it was reported lost at, and when
	cleared  int64 // the latest lost deadline it was reported recovered from
}

// losses is the stream's history of losses, by device.
type losses map[string]*loss

// history reads every lost and recovered event the stream holds, calling
// keep every 10,000 events.
func history(ctx context.Context, pub *dispatch.Bus, keep func() error) (losses, error) {
	h := losses{}
	n := 0
	err := pub.Losses(ctx, func(l *dispatch.Lost, r *dispatch.Recovered) error {
		if n++; n%10_000 == 0 {
			if err := keep(); err != nil {
				return err
			}
		}
		id := ""
		if l != nil {
			id = l.Device
		} else {
			id = r.Device
		}
		st := h[id]
		if st == nil {
			st = &loss{}
			h[id] = st
		}
		switch {
		case l != nil && l.Deadline > st.lost:
			st.lost, st.at = l.Deadline, l.FiredAt
		case r != nil && r.LostAt > st.cleared:
			st.cleared = r.LostAt
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("guard: read the stream's losses: %w", err)
	}
	return h, nil
}

// apply lays the stream's history over a registry record: the latest loss
// not followed by its recovery is the device's loss.
func (h losses) apply(r *dispatch.DeviceRecord) {
	st := h[r.ID]
	if st == nil {
		return
	}
	if r.LostDeadline != 0 && r.LostDeadline <= st.cleared {
		r.LostDeadline, r.LostAt = 0, 0
	}
	if st.lost > st.cleared && st.lost > r.LostDeadline {
		r.LostDeadline, r.LostAt = st.lost, st.at
	}
}
