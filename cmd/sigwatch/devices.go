package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/shard"
)

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
	var out struct {
		shard.DeviceView
		Alarm *alarm.View `json:"alarm,omitempty"`
	}
	out.DeviceView = v
	if a.alarms != nil {
		av, ok, err := a.alarms.Get(r.Context(), id)
		if err != nil {
			writeErr(w, err)
			return
		}
		if ok {
			out.Alarm = &av
		}
	}
	// A removed device keeps an idle alarm record (so late lost events raise
	// nothing); it is still not known.
	if !v.Known() && (out.Alarm == nil || out.Alarm.State == "idle") {
		writeError(w, http.StatusNotFound, "device not known")
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
	writeJSON(w, http.StatusOK, map[string]any{"device": id, "removed": removed, "alarm_resolved": resolved})
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
		if d, err = time.ParseDuration(body.Threshold); err != nil || d < 0 {
			writeError(w, http.StatusBadRequest, "threshold must be a non-negative Go duration such as 90s or 5m")
			return
		}
	}
	v, err := a.devices.SetThreshold(r.Context(), id, d)
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
	TS     int64  `json:"ts"`
}

func (a *App) postSignals(w http.ResponseWriter, r *http.Request) {
	if a.in == nil {
		writeError(w, http.StatusServiceUnavailable, "this process does not run the ingest role")
		return
	}
	var batch []signalIn
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20))
	if err := dec.Decode(&batch); err != nil {
		writeError(w, http.StatusBadRequest, `body must be a JSON array of {"device": "id", "type": "t", "ts": unix-ms (optional)}`)
		return
	}
	now := time.Now()
	for j, s := range batch {
		if err := a.validID(s.Device); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("signal %d: %v; nothing was stored", j, err))
			return
		}
	}
	for j, s := range batch {
		at := now
		if s.TS > 0 {
			at = clampTS(time.UnixMilli(s.TS), now, a.cfg.Timestamp.MaxSkew)
		}
		if err := a.in.Signal(r.Context(), s.Device, s.Type, at); err != nil {
			writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("signal %d: %v; signals before it were stored", j, err))
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]int{"stored": len(batch)})
}

// clampTS keeps a client's clock from pushing a deadline into the future or
// far into the past.
func clampTS(at, now time.Time, skew time.Duration) time.Time {
	if at.After(now) {
		return now
	}
	if at.Before(now.Add(-skew)) {
		return now.Add(-skew)
	}
	return at
}
