package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sigwatch/sigwatch/ingest"
)

// Signal is one signal posted to the API by a device that is not on MQTT.
type Signal struct {
	Device string `json:"device"`
	Type   string `json:"type"`
	Group  string `json:"group"`
	TS     int64  `json:"ts"`
	// TTD and Next declare the device's own deadline, as on MQTT: alive
	// for TTD seconds (-1: until further notice, 0: gone now), or until
	// Next (unix ms).
	TTD  *int64 `json:"ttd,omitempty"`
	Next int64  `json:"next,omitempty"`
}

// A POST /v1/signals body holds at most MaxSignalsPerPost entries in at
// most maxSignalsBody bytes: one body is one batch, stored well within a
// second, and holds in-flight slots only that long.
const (
	MaxSignalsPerPost = 10000
	maxSignalsBody    = 8 << 20
)

// postSignals stores a body of signals as one batch. The whole body is
// checked before anything is stored.
func (a *API) postSignals(w http.ResponseWriter, r *http.Request) {
	if a.o.Ingest == nil {
		writeError(w, http.StatusServiceUnavailable, "this process does not run the ingest role")
		return
	}
	var batch []Signal
	if err := decodeBody(w, r, maxSignalsBody, &batch); err != nil {
		if errors.As(err, new(*http.MaxBytesError)) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes; send at most %d signals per request", maxSignalsBody, MaxSignalsPerPost))
			return
		}
		writeError(w, http.StatusBadRequest, refusal(err, `body must be a JSON array of {"device": "id", "type": "t", "group": "g", "ts": unix-ms, "ttd": seconds, "next": unix-ms} (all but device optional)`))
		return
	}
	if len(batch) > MaxSignalsPerPost {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("%d signals in one body; send at most %d per request", len(batch), MaxSignalsPerPost))
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
		switch {
		case s.Next < 0:
			writeError(w, http.StatusBadRequest, fmt.Sprintf("signal %d: %s; nothing was stored", j, ingest.ErrBadNext.Msg))
			return
		case s.Next > 0:
			sigs[j].Declared = ingest.Declared{Set: true, Next: s.Next}
		case s.TTD != nil && *s.TTD < -1:
			writeError(w, http.StatusBadRequest, fmt.Sprintf("signal %d: %s; nothing was stored", j, ingest.ErrBadTTD.Msg))
			return
		case s.TTD != nil:
			sigs[j].Declared = ingest.Declared{Set: true, TTD: *s.TTD}
		}
		if s.TS > 0 {
			// Clamped by ingest against the moment the entry is stamped.
			sigs[j].At = time.UnixMilli(s.TS)
		}
	}
	if err := a.o.Ingest.Signals(r.Context(), sigs); err != nil {
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
