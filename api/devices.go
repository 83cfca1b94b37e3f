package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// Device is the device view GET /v1/devices/{id} answers.
type Device struct {
	shard.DeviceView
	Alarm *alarm.View `json:"alarm,omitempty"`
}

// deviceOf adds v's alarm to it.
func (a *API) deviceOf(ctx context.Context, v shard.DeviceView) (Device, error) {
	out := Device{DeviceView: v}
	if a.o.Alarms != nil {
		av, ok, err := a.o.Alarms.Get(ctx, v.Device)
		if err != nil {
			return out, err
		}
		if ok {
			out.Alarm = &av
		}
	}
	return out, nil
}

// device reads id's view with its alarm.
func (a *API) device(ctx context.Context, id string) (Device, error) {
	v, err := a.o.Devices.Get(ctx, id)
	if err != nil {
		return Device{}, err
	}
	return a.deviceOf(ctx, v)
}

func (a *API) getDevice(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.validID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	out, err := a.device(r.Context(), id)
	if err != nil {
		writeErr(w, err)
		return
	}
	// A removed device keeps an idle alarm record (so late lost events raise
	// nothing); it is still not known.
	if !out.Known() && (out.Alarm == nil || out.Alarm.State == "idle") {
		writeError(w, http.StatusNotFound, "device not known")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// removeDevice forgets id everywhere. The order is the invariant: the
// device stops being watched first, so no new loss can raise its alarm;
// the alarm is resolved (reason removed) next; the durable registry
// forgets it last, so the alarm's own record of the removal cannot bring
// the device back into it.
func (a *API) removeDevice(ctx context.Context, id string) (removed, resolved bool, err error) {
	if removed, err = a.o.Devices.Remove(ctx, id); err != nil {
		return false, false, err
	}
	if a.o.Alarms != nil {
		if resolved, err = a.o.Alarms.Remove(ctx, id); err != nil {
			return removed, false, err
		}
	}
	err = a.remember(ctx, id, func(r *dispatch.DeviceRecord, exists bool) (bool, bool) { return false, exists })
	return removed, resolved, err
}

func (a *API) deleteDevice(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.validID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	removed, resolved, err := a.removeDevice(r.Context(), id)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"device": id, "removed": removed, "alarm_resolved": resolved})
}

// remember applies change to id's record in the durable registry (a no-op
// without one).
func (a *API) remember(ctx context.Context, id string, change func(r *dispatch.DeviceRecord, exists bool) (keep, del bool)) error {
	if a.o.Registry == nil {
		return nil
	}
	if err := a.o.Registry.Update(ctx, []string{id}, change)[0]; err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	return nil
}

// known answers 404 for a device never seen (or removed) and returns
// false: a threshold or group set on a typo would otherwise be stored for
// a device that never comes. The registry learns a change only for a
// device it knows, and only when it changes.
func (a *API) known(w http.ResponseWriter, r *http.Request, id string) bool {
	v, err := a.o.Devices.Get(r.Context(), id)
	if err != nil {
		writeErr(w, err)
		return false
	}
	if !v.Known() {
		writeError(w, http.StatusNotFound, fmt.Sprintf("device %q not known: it never signalled, or was removed; check the id", id))
		return false
	}
	return true
}

// setGroup sets id's group in Redis, then in the durable registry, which
// learns it only for a device it knows, and only when it changes, so the
// registry never holds a device Redis has not seen.
func (a *API) setGroup(ctx context.Context, id, group string) error {
	if _, err := a.o.Store.SetGroup(ctx, id, group); err != nil {
		return err
	}
	return a.remember(ctx, id, func(r *dispatch.DeviceRecord, exists bool) (bool, bool) {
		changed := r.Group != group
		r.Group = group
		return exists && changed, false
	})
}

// putGroup is PUT /v1/devices/{id}/group {"group": "gw-17"} ("" removes
// it).
func (a *API) putGroup(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.validID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var body struct {
		Group *string `json:"group"`
	}
	if err := decodeBody(w, r, 4096, &body); err != nil || body.Group == nil {
		writeError(w, http.StatusBadRequest, refusal(err, `body must be {"group": "gw-17"} ("" removes the group)`))
		return
	}
	if err := shard.CheckGroup(*body.Group, a.o.MaxIDLen); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !a.known(w, r, id) {
		return
	}
	if err := a.setGroup(r.Context(), id, *body.Group); err != nil {
		writeErr(w, err)
		return
	}
	out, err := a.device(r.Context(), id)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *API) putThreshold(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.validID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var body struct {
		Threshold string `json:"threshold"`
	}
	if err := decodeBody(w, r, 4096, &body); err != nil {
		writeError(w, http.StatusBadRequest, refusal(err, `body must be {"threshold": "90s"} ("" or "0s" removes the override)`))
		return
	}
	var d time.Duration
	if body.Threshold != "" {
		var err error
		if d, err = time.ParseDuration(body.Threshold); err != nil || d < 0 || d > shard.MaxThreshold {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("threshold must be a Go duration such as 90s or 5m, from 0 to %v", shard.MaxThreshold))
			return
		}
	}
	if !a.known(w, r, id) {
		return
	}
	v, err := a.o.Devices.SetThreshold(r.Context(), id, d)
	if err != nil {
		writeErr(w, err)
		return
	}
	// Like a group, the registry learns an override only for a device it
	// knows, and only when it changes.
	err = a.remember(r.Context(), id, func(r *dispatch.DeviceRecord, exists bool) (bool, bool) {
		changed := r.Threshold != d.Milliseconds()
		r.Threshold = d.Milliseconds()
		return exists && changed, false
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}
