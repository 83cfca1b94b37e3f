package api

import (
	"context"
	"net/http"
	"strings"
	"time"
)

// healthz is the liveness probe: 503 while a loop of this process makes no
// progress (a restart helps); a dependency being down is readyz's business.
func (a *API) healthz(w http.ResponseWriter, r *http.Request) {
	if s := a.o.Stalled(); len(s) > 0 {
		http.Error(w, "stalled: "+strings.Join(s, ", "), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// readyz is the readiness probe: Redis, NATS, the broker (with ingest:
// connected, and answering ingest's probes) and Redis's data vetted by the
// guard.
func (a *API) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	var problems []string
	// Deps knows Redis is down without waiting on a client that may be
	// reconnecting; a process without it asks Redis.
	if a.o.Deps != nil {
		if why, down := a.o.Deps.Down("redis"); down {
			problems = append(problems, "redis: "+why)
		}
	} else if err := a.o.Store.Ping(ctx); err != nil {
		problems = append(problems, err.Error())
	}
	if !a.o.Pub.Connected() {
		problems = append(problems, "nats: not connected")
	}
	if a.o.Ingest != nil && !a.o.Ingest.Connected() {
		problems = append(problems, "mqtt: not connected")
	} else if a.o.Ingest != nil {
		if ok, why := a.o.Ingest.Answering(); !ok {
			problems = append(problems, "mqtt: "+why)
		}
	}
	if ok, why := a.o.Guard.Ready(); !ok {
		problems = append(problems, why)
	}
	if len(problems) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "problems": problems})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true})
}
