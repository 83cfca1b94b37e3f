package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/statuspage"
	"github.com/sigwatch/sigwatch/shard"
)

// routes is the admin API. /metrics, /healthz and /readyz are open (they
// carry no device data); /v1 needs the bearer token when one is set.
func (a *App) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /{$}", statuspage.Handler()) // the status page: no data, its script calls /v1 with the token
	mux.Handle("GET /ui/", statuspage.Handler())

	v1 := http.NewServeMux()
	v1.HandleFunc("GET /v1/devices", a.getDevices)
	v1.HandleFunc("GET /v1/alarms", a.withAlarms(a.getAlarms))
	v1.HandleFunc("GET /v1/devices/{id}", a.getDevice)
	v1.HandleFunc("DELETE /v1/devices/{id}", a.deleteDevice)
	v1.HandleFunc("PUT /v1/devices/{id}/threshold", a.putThreshold)
	v1.HandleFunc("PUT /v1/devices/{id}/group", a.putGroup)
	v1.HandleFunc("POST /v1/devices/{id}/ack", a.postAck)
	v1.HandleFunc("GET /v1/mutes", a.withAlarms(a.getMutes))
	v1.HandleFunc("POST /v1/mutes", a.withAlarms(a.postMute))
	v1.HandleFunc("DELETE /v1/mutes/{id}", a.withAlarms(a.deleteMute))
	v1.HandleFunc("POST /v1/signals", a.postSignals)
	v1.HandleFunc("GET /v1/shards", a.getShards)
	v1.HandleFunc("POST /v1/shards/double", a.postShardsDouble)
	v1.HandleFunc("GET /v1/stats", a.getStats)
	v1.HandleFunc("GET /v1/storms", a.withAlarms(a.getStorms))
	v1.HandleFunc("POST /v1/groups/{group}/ack", a.withAlarms(a.postGroupAck))
	v1.HandleFunc("POST /v1/fleet/ack", a.withAlarms(a.postFleetAck))
	if a.timerSvc != nil {
		a.timerSvc.Routes(v1)
	} else {
		v1.HandleFunc("/v1/timers/", func(w http.ResponseWriter, _ *http.Request) {
			writeError(w, http.StatusServiceUnavailable, "timers are off here (timers.enabled: false)")
		})
	}
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
	if err := a.store.Ping(ctx); err != nil {
		problems = append(problems, err.Error())
	}
	if !a.pub.Connected() {
		problems = append(problems, "nats: not connected")
	}
	if a.in != nil && !a.in.Connected() {
		problems = append(problems, "mqtt: not connected")
	}
	if ok, why := a.guard.Ready(); !ok {
		problems = append(problems, why)
	}
	if len(problems) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "problems": problems})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true})
}

// validID refuses ids ingest would refuse, with the one check MQTT and
// HTTP share, so the API cannot create devices MQTT never could.
func (a *App) validID(id string) error {
	err := shard.CheckID(id, a.cfg.Ingest.MaxIDLen)
	if errors.Is(err, ingest.ErrIDTooLong) {
		return fmt.Errorf("%w: %d bytes, the limit is %d (ingest.max_id_len)", err, len(id), a.cfg.Ingest.MaxIDLen)
	}
	return err
}

// errStatus is the one mapping of domain errors to HTTP status codes: a
// refusal the caller can act on is 4xx, anything else means a dependency
// (Redis, NATS) is not answering.
func errStatus(err error) int {
	switch {
	case errors.Is(err, ingest.ErrEmptyID), errors.Is(err, ingest.ErrIDTooLong), errors.Is(err, ingest.ErrBadID),
		errors.Is(err, ingest.ErrReservedID), errors.Is(err, alarm.ErrBadMute):
		return http.StatusBadRequest
	case errors.Is(err, alarm.ErrNoAlarm), errors.Is(err, shard.ErrDraining):
		return http.StatusConflict
	}
	return http.StatusServiceUnavailable
}

// writeErr answers err with the status errStatus gives it.
func writeErr(w http.ResponseWriter, err error) { writeError(w, errStatus(err), err.Error()) }
