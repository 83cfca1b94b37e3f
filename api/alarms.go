package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
)

// noAlarms answers alarm requests of a process that has no alarms (NATS in
// core mode) and reports whether it did.
func (a *API) noAlarms(w http.ResponseWriter) bool {
	if a.o.Alarms != nil {
		return false
	}
	writeError(w, http.StatusServiceUnavailable, "alarms need nats.mode jetstream")
	return true
}

// withAlarms serves h in a process that has alarms; noAlarms answers in
// one that has not.
func (a *API) withAlarms(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.noAlarms(w) {
			h(w, r)
		}
	}
}

// maxWindow bounds how far ahead an ack or a mute may end.
const maxWindow = 10 * 366 * 24 * time.Hour

// window reads the end of an ack or a mute: "until" (RFC 3339, or unix ms
// as a number or a string) or "for" (a Go duration from now), at most
// maxWindow ahead. Neither gives the zero time.
func window(until json.RawMessage, dur string, now time.Time) (time.Time, error) {
	const use = `give "until" as RFC 3339 or unix ms, or "for" as a duration such as 30m`
	u := strings.TrimSpace(string(until))
	switch {
	case u != "" && u != "null" && dur != "":
		return time.Time{}, errors.New("give either until or for, not both")
	case dur != "":
		d, err := time.ParseDuration(dur)
		if err != nil || d <= 0 || d > maxWindow {
			return time.Time{}, fmt.Errorf("for %q: %s, positive and at most %v", dur, use, maxWindow)
		}
		return now.Add(d), nil
	case u == "" || u == "null":
		return time.Time{}, nil
	}
	var v any
	if err := json.Unmarshal(until, &v); err != nil {
		return time.Time{}, errors.New(use)
	}
	var (
		t  time.Time
		ok bool
	)
	switch x := v.(type) {
	case float64:
		// Whole milliseconds within what a time holds, checked before the
		// conversion, which is undefined beyond int64.
		if ok = x == math.Trunc(x) && math.Abs(x) < 1<<53; ok {
			t = time.UnixMilli(int64(x))
		}
	case string:
		if ms, err := strconv.ParseInt(x, 10, 64); err == nil && ms > -(1<<53) && ms < 1<<53 {
			t, ok = time.UnixMilli(ms), true
		} else if p, err := time.Parse(time.RFC3339, x); err == nil {
			t, ok = p, true
		}
	}
	switch {
	case !ok:
		return time.Time{}, fmt.Errorf("until %s: %s", u, use)
	case t.After(now.Add(maxWindow)):
		return time.Time{}, fmt.Errorf("until %s is more than %v ahead", u, maxWindow)
	}
	return t, nil
}

// postAck is POST /v1/devices/{id}/ack with an optional body
// {"until": ...} or {"for": "30m"}: without an end the alarm is resolved
// (reason acked); with one its repeats pause until then and resume if the
// device is still silent.
func (a *API) postAck(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.validID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if a.noAlarms(w) {
		return
	}
	until, ok := a.ackUntil(w, r)
	if !ok {
		return
	}
	v, err := a.o.Alarms.Ack(r.Context(), id, until, callerOf(r.Context()).Name)
	switch {
	case errors.Is(err, alarm.ErrNoAlarm):
		writeError(w, http.StatusConflict, fmt.Sprintf("device %s has no open alarm", id))
		return
	case err != nil:
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// ackUntil reads the body of an ack: empty, {"until": ...} or {"for":
// "30m"}. It answers a bad one itself and returns false.
func (a *API) ackUntil(w http.ResponseWriter, r *http.Request) (time.Time, bool) {
	var body struct {
		Until json.RawMessage `json:"until"`
		For   string          `json:"for"`
	}
	if err := decodeBody(w, r, 4096, &body); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, refusal(err, `body must be empty, {"until": "2030-01-02T15:04:05Z" or unix ms} or {"for": "30m"}`))
		return time.Time{}, false
	}
	now := a.o.Now()
	until, err := window(body.Until, body.For, now)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return time.Time{}, false
	}
	if !until.IsZero() && !until.After(now) {
		writeError(w, http.StatusBadRequest, "until is in the past: leave it out to resolve the alarm")
		return time.Time{}, false
	}
	return until, true
}

// muteIn is the body of POST /v1/mutes.
type muteIn struct {
	Device  string          `json:"device"`
	Type    string          `json:"type"`
	Until   json.RawMessage `json:"until"`
	For     string          `json:"for"`
	Comment string          `json:"comment"`
}

func (a *API) postMute(w http.ResponseWriter, r *http.Request) {
	const use = `body must be {"device": "id"} or {"type": "t"}, with {"for": "1h"} or {"until": RFC 3339 or unix ms}, and an optional "comment"`
	var in muteIn
	if err := decodeBody(w, r, 16384, &in); err != nil {
		writeError(w, http.StatusBadRequest, refusal(err, use))
		return
	}
	noteTarget(r, muteTarget("", in.Device, in.Type))
	if (in.Device == "") == (in.Type == "") {
		writeError(w, http.StatusBadRequest, "give exactly one of device or type")
		return
	}
	if in.Device != "" {
		if err := a.validID(in.Device); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	now := a.o.Now()
	until, err := window(in.Until, in.For, now)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !until.After(now) {
		writeError(w, http.StatusBadRequest, "a mute needs an end in the future: "+use)
		return
	}
	m, err := a.o.Alarms.AddMute(r.Context(), alarm.Mute{Device: in.Device, Type: in.Type, Until: until.UnixMilli(), Comment: in.Comment})
	if err != nil {
		writeErr(w, err)
		return
	}
	noteTarget(r, muteTarget(m.ID, in.Device, in.Type))
	writeJSON(w, http.StatusCreated, m)
}

func (a *API) getMutes(w http.ResponseWriter, r *http.Request) {
	ms, err := a.o.Alarms.Mutes(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, ms)
}

func (a *API) deleteMute(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ok, err := a.o.Alarms.RemoveMute(r.Context(), id)
	switch {
	case err != nil:
		writeErr(w, err)
	case !ok:
		writeError(w, http.StatusNotFound, "no mute "+id)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "removed": true})
	}
}

// muteTarget is the audit target of a mute: its id, once it has one, and
// what it covers.
func muteTarget(id, device, typ string) string {
	var parts []string
	if id != "" {
		parts = append(parts, id)
	}
	if device != "" {
		parts = append(parts, "device "+device)
	}
	if typ != "" {
		parts = append(parts, "type "+typ)
	}
	return strings.Join(parts, " ")
}
