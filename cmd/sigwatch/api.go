package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/shard"
)

// routes is the admin API. /metrics, /healthz and /readyz are open (they
// carry no device data); /v1 needs the bearer token when one is set.
func (a *App) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", a.readyz)

	v1 := http.NewServeMux()
	v1.HandleFunc("GET /v1/devices/{id}", a.getDevice)
	v1.HandleFunc("DELETE /v1/devices/{id}", a.deleteDevice)
	v1.HandleFunc("PUT /v1/devices/{id}/threshold", a.putThreshold)
	v1.HandleFunc("POST /v1/devices/{id}/ack", a.postAck)
	v1.HandleFunc("GET /v1/mutes", a.getMutes)
	v1.HandleFunc("POST /v1/mutes", a.postMute)
	v1.HandleFunc("DELETE /v1/mutes/{id}", a.deleteMute)
	v1.HandleFunc("POST /v1/signals", a.postSignals)
	v1.HandleFunc("GET /v1/shards", a.getShards)
	v1.HandleFunc("POST /v1/shards/double", a.postShardsDouble)
	mux.Handle("/v1/", a.auth(v1))
	return mux
}

func (a *App) auth(next http.Handler) http.Handler {
	if a.cfg.HTTP.Token == "" {
		return next
	}
	want := []byte("Bearer " + a.cfg.HTTP.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func (a *App) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	var problems []string
	if err := a.rc.Do(ctx, a.rc.B().Ping().Build()).Error(); err != nil {
		problems = append(problems, "redis: "+err.Error())
	}
	if !a.nc.IsConnected() {
		problems = append(problems, "nats: not connected")
	}
	if a.in != nil && !a.in.Connected() {
		problems = append(problems, "mqtt: not connected")
	}
	if len(problems) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "problems": problems})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true})
}

// validID refuses ids ingest would refuse, so the API cannot create devices
// MQTT never could.
func (a *App) validID(id string) error {
	switch {
	case id == "":
		return errors.New("empty device id")
	case len(id) > a.cfg.Ingest.MaxIDLen:
		return fmt.Errorf("device id longer than %d bytes", a.cfg.Ingest.MaxIDLen)
	case !utf8.ValidString(id):
		return errors.New("device id is not valid UTF-8")
	case strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return errors.New("device id contains control characters")
	}
	return nil
}

// deviceView is the API's answer about one device.
type deviceView struct {
	Device       string `json:"device"`
	Type         string `json:"type"`
	Watched      bool   `json:"watched"`
	Shard        int    `json:"shard"`
	Deadline     int64  `json:"deadline,omitempty"`
	LastSeen     int64  `json:"last_seen,omitempty"`
	ThresholdMS  int64  `json:"threshold_ms"`
	FirstSeen    int64  `json:"first_seen,omitempty"`
	Lost         bool   `json:"lost"`
	LostDeadline int64  `json:"lost_deadline,omitempty"`
	LostAt       int64  `json:"lost_at,omitempty"`
}

// locate returns the shards that may hold id: its shard now and, while a
// doubling drains, its shard before it.
func locate(t shard.Topology, id string) []int {
	cur := shard.Of(id, t.Shards)
	if t.Prev != 0 {
		if old := shard.Of(id, t.Prev); old != cur {
			return []int{cur, old}
		}
	}
	return []int{cur}
}

func (a *App) device(ctx context.Context, id string) (deviceView, error) {
	t := a.topo.Current()
	v := deviceView{Device: id}
	for j, i := range locate(t, id) {
		d, ok, err := a.store.Score(ctx, shard.Deadlines, i, id)
		if err != nil {
			return v, err
		}
		if j == 0 {
			v.Shard = i
		}
		if ok && d > v.Deadline {
			v.Watched, v.Deadline, v.Shard = true, d, i
		}
	}
	ds, err := a.store.Devices(ctx, []string{id})
	if err != nil {
		return v, err
	}
	reg := ds[0]
	v.Type, v.FirstSeen = reg.Type, reg.FirstSeen
	v.Lost, v.LostDeadline, v.LostAt = reg.LostDeadline != 0, reg.LostDeadline, reg.LostAt
	thr := a.thr.For(id, reg.Type)
	v.ThresholdMS = thr.Milliseconds()
	if v.Watched {
		v.LastSeen = v.Deadline - v.ThresholdMS
	}
	return v, nil
}

func (a *App) getDevice(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.validID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	v, err := a.device(r.Context(), id)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	var out struct {
		deviceView
		Alarm *alarm.View `json:"alarm,omitempty"`
	}
	out.deviceView = v
	if a.alarms != nil {
		av, ok, err := a.alarms.Get(r.Context(), id)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		if ok {
			out.Alarm = &av
		}
	}
	// A removed device keeps an idle alarm record (so late lost events raise
	// nothing); it is still not known.
	if !v.Watched && v.FirstSeen == 0 && !v.Lost && (out.Alarm == nil || out.Alarm.State == "idle") {
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
	removed := false
	for _, i := range locate(a.topo.Current(), id) {
		ok, err := a.store.Remove(ctx, shard.Deadlines, i, id)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		removed = removed || ok
	}
	if err := a.store.Forget(ctx, id); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	// The alarm is resolved (reason removed) after the device is no longer
	// watched, so no new loss can raise it again meanwhile.
	resolved := false
	if a.alarms != nil {
		var err error
		if resolved, err = a.alarms.Remove(ctx, id); err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
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
	ctx := r.Context()
	// The last signal is read under the old threshold, before it changes.
	v, err := a.device(ctx, id)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	if err := a.store.SetOverride(ctx, id, d); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	if err := a.thr.Reload(ctx); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	// A watched device gets its new deadline now, counted from its last
	// signal, so a lowered threshold takes effect without waiting out the
	// old one: the ZADD GT of the next signal could not pull it back.
	if v.Watched {
		next := v.LastSeen + a.thr.For(id, v.Type).Milliseconds()
		// Written to the device's shard under the topology in force, never to
		// a shard a doubling is draining.
		cur := shard.Of(id, a.topo.Current().Shards)
		if err := a.store.Set(ctx, shard.Deadlines, cur, shard.Entry{ID: id, Deadline: next}); err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		v.Deadline = next
	}
	v.ThresholdMS = a.thr.For(id, v.Type).Milliseconds()
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

// shardView is one shard in GET /v1/shards.
type shardView struct {
	Shard        int    `json:"shard"`
	Size         int64  `json:"size"`
	HeadDeadline int64  `json:"head_deadline,omitempty"`
	HeadLagMS    int64  `json:"head_lag_ms"`
	Owner        string `json:"owner"`
}

// shardsView is GET /v1/shards.
type shardsView struct {
	shard.Topology
	Watermark    int64       `json:"watermark"`
	WatermarkLag int64       `json:"watermark_lag_ms"`
	Drain        drainView   `json:"drain"`
	Devices      int64       `json:"devices"`
	List         []shardView `json:"list"`
	// Timers is the topology of the alarm's repeat timers (absent before
	// the alarm role first ran), with the number of timers.
	Timers *timersView `json:"alarm_timers,omitempty"`
}

// timersView is the alarm's repeat timer queue in GET /v1/shards.
type timersView struct {
	shard.Topology
	Size int64 `json:"size"`
}

func shardsStatus(ctx context.Context, store *shard.Store, now time.Time) (shardsView, error) {
	t, err := store.Topology(ctx)
	if err != nil {
		return shardsView{}, err
	}
	wm, _, err := store.Watermark(ctx)
	if err != nil {
		return shardsView{}, err
	}
	v := shardsView{Topology: t, Watermark: wm}
	if wm > 0 {
		v.WatermarkLag = now.UnixMilli() - wm
	}
	if v.Drain, err = drainStatus(ctx, store, now); err != nil {
		return v, err
	}
	timers := store.Alarm()
	if rt, err := timers.Topology(ctx); err == nil {
		v.Timers = &timersView{Topology: rt}
		sts, err := timers.Status(ctx, shard.Repeats, rt.Shards)
		if err != nil {
			return v, err
		}
		for _, st := range sts {
			v.Timers.Size += st.Size
		}
	}
	sts, err := store.Status(ctx, shard.Deadlines, t.Shards)
	if err != nil {
		return v, err
	}
	for _, st := range sts {
		sv := shardView{Shard: st.Shard, Size: st.Size, Owner: st.Owner}
		if st.HasHead {
			sv.HeadDeadline = st.Head.Deadline
			if lag := now.UnixMilli() - st.Head.Deadline; lag > 0 {
				sv.HeadLagMS = lag
			}
		}
		v.Devices += sv.Size
		v.List = append(v.List, sv)
	}
	return v, nil
}

func (a *App) getShards(w http.ResponseWriter, r *http.Request) {
	v, err := shardsStatus(r.Context(), a.store, time.Now())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// noAlarms answers alarm requests of a process that has no alarms (NATS in
// core mode) and reports whether it did.
func (a *App) noAlarms(w http.ResponseWriter) bool {
	if a.alarms != nil {
		return false
	}
	writeError(w, http.StatusServiceUnavailable, "alarms need nats.mode jetstream")
	return true
}

// window reads the end of an ack or a mute: "until" (RFC 3339, or unix ms
// as a number or a string) or "for" (a Go duration from now). Neither gives
// the zero time.
func window(until json.RawMessage, dur string, now time.Time) (time.Time, error) {
	const use = `give "until" as RFC 3339 or unix ms, or "for" as a duration such as 30m`
	u := strings.TrimSpace(string(until))
	switch {
	case u != "" && u != "null" && dur != "":
		return time.Time{}, errors.New("give either until or for, not both")
	case dur != "":
		d, err := time.ParseDuration(dur)
		if err != nil || d <= 0 {
			return time.Time{}, fmt.Errorf("for %q: %s", dur, use)
		}
		return now.Add(d), nil
	case u == "" || u == "null":
		return time.Time{}, nil
	}
	var v any
	if err := json.Unmarshal(until, &v); err != nil {
		return time.Time{}, errors.New(use)
	}
	switch x := v.(type) {
	case float64:
		return time.UnixMilli(int64(x)), nil
	case string:
		if ms, err := strconv.ParseInt(x, 10, 64); err == nil {
			return time.UnixMilli(ms), nil
		}
		if t, err := time.Parse(time.RFC3339, x); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("until %s: %s", u, use)
}

// postAck is POST /v1/devices/{id}/ack with an optional body
// {"until": ...} or {"for": "30m"}: without an end the alarm is resolved
// (reason acked); with one its repeats pause until then and resume if the
// device is still silent.
func (a *App) postAck(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := a.validID(id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if a.noAlarms(w) {
		return
	}
	var body struct {
		Until json.RawMessage `json:"until"`
		For   string          `json:"for"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, `body must be empty, {"until": "2030-01-02T15:04:05Z" or unix ms} or {"for": "30m"}`)
		return
	}
	now := time.Now()
	until, err := window(body.Until, body.For, now)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !until.IsZero() && !until.After(now) {
		writeError(w, http.StatusBadRequest, "until is in the past: leave it out to resolve the alarm")
		return
	}
	v, err := a.alarms.Ack(r.Context(), id, until)
	switch {
	case errors.Is(err, alarm.ErrNoAlarm):
		writeError(w, http.StatusConflict, fmt.Sprintf("device %s has no open alarm", id))
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// muteIn is the body of POST /v1/mutes.
type muteIn struct {
	Device  string          `json:"device"`
	Type    string          `json:"type"`
	Until   json.RawMessage `json:"until"`
	For     string          `json:"for"`
	Comment string          `json:"comment"`
}

func (a *App) postMute(w http.ResponseWriter, r *http.Request) {
	if a.noAlarms(w) {
		return
	}
	const use = `body must be {"device": "id"} or {"type": "t"}, with {"for": "1h"} or {"until": RFC 3339 or unix ms}, and an optional "comment"`
	var in muteIn
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16384)).Decode(&in); err != nil {
		writeError(w, http.StatusBadRequest, use)
		return
	}
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
	now := time.Now()
	until, err := window(in.Until, in.For, now)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !until.After(now) {
		writeError(w, http.StatusBadRequest, "a mute needs an end in the future: "+use)
		return
	}
	m, err := a.alarms.AddMute(r.Context(), alarm.Mute{Device: in.Device, Type: in.Type, Until: until.UnixMilli(), Comment: in.Comment})
	switch {
	case errors.Is(err, alarm.ErrBadMute):
		writeError(w, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusCreated, m)
}

func (a *App) getMutes(w http.ResponseWriter, r *http.Request) {
	if a.noAlarms(w) {
		return
	}
	ms, err := a.alarms.Mutes(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, ms)
}

func (a *App) deleteMute(w http.ResponseWriter, r *http.Request) {
	if a.noAlarms(w) {
		return
	}
	id := r.PathValue("id")
	ok, err := a.alarms.RemoveMute(r.Context(), id)
	switch {
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case !ok:
		writeError(w, http.StatusNotFound, "no mute "+id)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "removed": true})
	}
}
