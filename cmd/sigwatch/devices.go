package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/shard"
)

// deviceOut is the device view GET /v1/devices/{id} answers.
type deviceOut struct {
	shard.DeviceView
	Alarm *alarm.View `json:"alarm,omitempty"`
}

// deviceOf reads the device view of id, with its alarm.
func (a *App) deviceOf(ctx context.Context, v shard.DeviceView) (deviceOut, error) {
	out := deviceOut{DeviceView: v}
	if a.alarms != nil {
		av, ok, err := a.alarms.Get(ctx, v.Device)
		if err != nil {
			return out, err
		}
		if ok {
			out.Alarm = &av
		}
	}
	return out, nil
}

func (a *App) getDevice(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.validID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	v, err := a.devices.Get(r.Context(), id)
	if err != nil {
		writeErr(w, err)
		return
	}
	out, err := a.deviceOf(r.Context(), v)
	if err != nil {
		writeErr(w, err)
		return
	}
	// A removed device keeps an idle alarm record (so late lost events raise
	// nothing); it is still not known.
	if !v.Known() && (out.Alarm == nil || out.Alarm.State == "idle") {
		writeError(w, http.StatusNotFound, "device not known")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// putGroup is PUT /v1/devices/{id}/group {"group": "gw-17"} ("" removes
// it). As a threshold override, a group may be set before the device is
// first seen; the durable registry learns it for a device it knows, and
// only when it changes.
func (a *App) putGroup(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.validID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var body struct {
		Group *string `json:"group"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body); err != nil || body.Group == nil {
		writeError(w, http.StatusBadRequest, `body must be {"group": "gw-17"} ("" removes the group)`)
		return
	}
	group := *body.Group
	if err := shard.CheckGroup(group, a.cfg.Ingest.MaxIDLen); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx := r.Context()
	if _, err := a.store.SetGroup(ctx, id, group); err != nil {
		writeErr(w, err)
		return
	}
	err := a.remember(ctx, id, func(r *dispatch.DeviceRecord, exists bool) (bool, bool) {
		changed := r.Group != group
		r.Group = group
		return exists && changed, false
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	v, err := a.devices.Get(ctx, id)
	if err != nil {
		writeErr(w, err)
		return
	}
	out, err := a.deviceOf(ctx, v)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *App) deleteDevice(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.validID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx := r.Context()
	removed, err := a.devices.Remove(ctx, id)
	if err != nil {
		writeErr(w, err)
		return
	}
	// The alarm is resolved (reason removed) after the device is no longer
	// watched, so no new loss can raise it again meanwhile.
	resolved := false
	if a.alarms != nil {
		if resolved, err = a.alarms.Remove(ctx, id); err != nil {
			writeErr(w, err)
			return
		}
	}
	// Last, so that the alarm's own record of the removal cannot bring
	// the device back into the registry.
	if err := a.remember(ctx, id, func(r *dispatch.DeviceRecord, exists bool) (bool, bool) { return false, exists }); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"device": id, "removed": removed, "alarm_resolved": resolved})
}

// remember applies change to id's record in the durable registry (a no-op
// without one).
func (a *App) remember(ctx context.Context, id string, change func(r *dispatch.DeviceRecord, exists bool) (keep, del bool)) error {
	if a.registry == nil {
		return nil
	}
	if err := a.registry.Update(ctx, []string{id}, change)[0]; err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	return nil
}

func (a *App) putThreshold(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.validID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var body struct {
		Threshold string `json:"threshold"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, `body must be {"threshold": "90s"} ("" or "0s" removes the override)`)
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
	v, err := a.devices.SetThreshold(r.Context(), id, d)
	if err != nil {
		writeErr(w, err)
		return
	}
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

// signalIn is one signal posted to the API by a device that is not on MQTT.
type signalIn struct {
	Device string `json:"device"`
	Type   string `json:"type"`
	Group  string `json:"group"`
	TS     int64  `json:"ts"`
}

// A POST /v1/signals body holds at most maxSignalsPerPost entries in at
// most maxSignalsBody bytes: one body is one batch, stored well within a
// second, and holds in-flight slots only that long.
const (
	maxSignalsPerPost = 10000
	maxSignalsBody    = 8 << 20
)

// postSignals stores a body of signals as one batch. The whole body is
// checked before anything is stored.
func (a *App) postSignals(w http.ResponseWriter, r *http.Request) {
	if a.in == nil {
		writeError(w, http.StatusServiceUnavailable, "this process does not run the ingest role")
		return
	}
	var batch []signalIn
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxSignalsBody))
	if err := dec.Decode(&batch); err != nil {
		if errors.As(err, new(*http.MaxBytesError)) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes; send at most %d signals per request", maxSignalsBody, maxSignalsPerPost))
			return
		}
		writeError(w, http.StatusBadRequest, `body must be a JSON array of {"device": "id", "type": "t", "group": "g", "ts": unix-ms (optional)}`)
		return
	}
	if len(batch) > maxSignalsPerPost {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("%d signals in one body; send at most %d per request", len(batch), maxSignalsPerPost))
		return
	}
	sigs := make([]ingest.Sig, len(batch))
	for j, s := range batch {
		if err := a.validID(s.Device); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("signal %d: %v; nothing was stored", j, err))
			return
		}
		if s.TS < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("signal %d: ts %d is not a unix time in ms; nothing was stored", j, s.TS))
			return
		}
		sigs[j] = ingest.Sig{ID: s.Device, Type: s.Type, Group: s.Group}
		if s.TS > 0 {
			// Clamped by ingest against the moment the entry is stamped.
			sigs[j].At = time.UnixMilli(s.TS)
		}
	}
	if err := a.in.Signals(r.Context(), sigs); err != nil {
		var se *ingest.SignalError
		if errors.As(err, &se) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("signal %d: %v; nothing was stored", se.Index, se.Err))
			return
		}
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("%v; some signals may be stored, sending the body again is safe", err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"stored": len(batch)})
}
