package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/timer"
)

// The timer API:
//
//	PUT    /v1/timers/{queue}/{id}  one reset → {"queue","id","deadline"}
//	GET    /v1/timers/{queue}/{id}  the timer → {"queue","id","deadline","payload"}
//	DELETE /v1/timers/{queue}/{id}  cancel → 204, 404 when there is none
//	POST   /v1/timers/{queue}       a batch, stored as one → {"queue","stored"}

func (a *API) putTimer(w http.ResponseWriter, r *http.Request) {
	s := a.o.Timers
	queue, id := r.PathValue("queue"), r.PathValue("id")
	var req timer.Request
	if !a.decodeTimers(w, r, int64(s.Limits().MaxPayload)+4096, &req) {
		return
	}
	if req.ID != "" && req.ID != id {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("body id %q is not the id in the path %q", req.ID, id))
		return
	}
	tr, err := s.Limits().Reset(queue, id, req, s.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.Reset(r.Context(), []shard.TimerReset{tr}); err != nil {
		writeErr(w, err)
		return
	}
	s.Stored("http", 1)
	deadline := tr.Deadline
	if !tr.Set {
		// An extend leaves a later deadline as it is: say which holds.
		if t, ok, err := s.Get(r.Context(), queue, id); err == nil && ok {
			deadline = t.Deadline
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"queue": queue, "id": id, "deadline": deadline})
}

// timerName reads the queue and the id of the path, or answers 400 when no
// reset could have stored them.
func (a *API) timerName(w http.ResponseWriter, r *http.Request) (queue, id string, ok bool) {
	queue, id = r.PathValue("queue"), r.PathValue("id")
	if err := a.o.Timers.Limits().CheckName(queue, id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", "", false
	}
	return queue, id, true
}

// noTimer answers 404 for a timer that is not there.
func noTimer(w http.ResponseWriter, queue, id string) {
	writeError(w, http.StatusNotFound, fmt.Sprintf("no timer %q in queue %q (never set, fired or cancelled)", id, queue))
}

func (a *API) getTimer(w http.ResponseWriter, r *http.Request) {
	s := a.o.Timers
	queue, id, ok := a.timerName(w, r)
	if !ok {
		return
	}
	t, ok, err := s.Get(r.Context(), queue, id)
	switch {
	case err != nil:
		writeErr(w, err)
	case !ok:
		noTimer(w, queue, id)
	default:
		writeJSON(w, http.StatusOK, t)
	}
}

func (a *API) deleteTimer(w http.ResponseWriter, r *http.Request) {
	queue, id, ok := a.timerName(w, r)
	if !ok {
		return
	}
	ok, err := a.o.Timers.Cancel(r.Context(), queue, id)
	switch {
	case err != nil:
		writeErr(w, err)
	case !ok:
		noTimer(w, queue, id)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

func (a *API) postTimers(w http.ResponseWriter, r *http.Request) {
	s := a.o.Timers
	queue := r.PathValue("queue")
	if err := timer.CheckQueue(queue); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var reqs []timer.Request
	if !a.decodeTimers(w, r, timer.MaxBatchBody(s.Limits().MaxPayload), &reqs) {
		return
	}
	if len(reqs) > timer.MaxBatch {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("%d resets in one body; send at most %d per request", len(reqs), timer.MaxBatch))
		return
	}
	now := s.Now()
	rs := make([]shard.TimerReset, len(reqs))
	for j, req := range reqs {
		tr, err := s.Limits().Reset(queue, req.ID, req, now)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("timer %d: %v; nothing was stored", j, err))
			return
		}
		rs[j] = tr
	}
	if err := s.Reset(r.Context(), rs); err != nil {
		writeErr(w, err)
		return
	}
	s.Stored("http", len(rs))
	writeJSON(w, http.StatusOK, map[string]any{"queue": queue, "stored": len(rs)})
}

// decodeTimers reads a JSON body of at most limit bytes into v, or answers
// the request with what is wrong.
func (a *API) decodeTimers(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	err := decodeBody(w, r, limit, v)
	switch {
	case err == nil:
		return true
	case errors.As(err, new(*http.MaxBytesError)):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes (timers.max_payload is %d); send a larger batch in several requests", limit, a.o.Timers.Limits().MaxPayload))
	default:
		writeError(w, http.StatusBadRequest, refusal(err, `body must be JSON: {"after": "30s" | "at": unix-ms, "mode": "extend" | "set", "payload": any JSON} (an array of them, each with "id", for a batch)`))
	}
	return false
}
