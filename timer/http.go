package timer

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/sigwatch/sigwatch/shard"
)

// MaxBatch bounds the resets of one POST /v1/timers/{queue}.
const MaxBatch = 10_000

// MaxBatchBody bounds the body of one POST /v1/timers/{queue} with
// timers.max_payload at maxPayload: 4 MiB of small resets (about 400 B
// each at the most resets) and room for 8 payloads of the largest size.
// The body is decoded whole before anything is stored, so it is what one
// request may hold in memory; more goes in more requests.
func MaxBatchBody(maxPayload int) int64 { return 4<<20 + 8*int64(maxPayload) }

// Routes adds the timer API to mux:
//
//	PUT    /v1/timers/{queue}/{id}  one reset → {"queue","id","deadline"}
//	GET    /v1/timers/{queue}/{id}  the timer → {"queue","id","deadline","payload"}
//	DELETE /v1/timers/{queue}/{id}  cancel → 204, 404 when there is none
//	POST   /v1/timers/{queue}       a batch, stored as one → {"queue","stored"}
func (s *Service) Routes(mux *http.ServeMux) {
	mux.HandleFunc("PUT /v1/timers/{queue}/{id...}", s.put)
	mux.HandleFunc("GET /v1/timers/{queue}/{id...}", s.get)
	mux.HandleFunc("DELETE /v1/timers/{queue}/{id...}", s.del)
	mux.HandleFunc("POST /v1/timers/{queue}", s.post)
}

func (s *Service) put(w http.ResponseWriter, r *http.Request) {
	queue, id := r.PathValue("queue"), r.PathValue("id")
	var req Request
	if !s.decode(w, r, int64(s.opts.Limits.MaxPayload)+4096, &req) {
		return
	}
	if req.ID != "" && req.ID != id {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("body id %q is not the id in the path %q", req.ID, id))
		return
	}
	tr, err := s.opts.Limits.Reset(queue, id, req, s.opts.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.Reset(r.Context(), []shard.TimerReset{tr}); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
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

func (s *Service) get(w http.ResponseWriter, r *http.Request) {
	queue, id := r.PathValue("queue"), r.PathValue("id")
	if err := s.checkName(queue, id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	t, ok, err := s.Get(r.Context(), queue, id)
	switch {
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case !ok:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no timer %q in queue %q (never set, fired or cancelled)", id, queue))
	default:
		writeJSON(w, http.StatusOK, t)
	}
}

func (s *Service) del(w http.ResponseWriter, r *http.Request) {
	queue, id := r.PathValue("queue"), r.PathValue("id")
	if err := s.checkName(queue, id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ok, err := s.Cancel(r.Context(), queue, id)
	switch {
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case !ok:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no timer %q in queue %q (never set, fired or cancelled)", id, queue))
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Service) post(w http.ResponseWriter, r *http.Request) {
	queue := r.PathValue("queue")
	if err := CheckQueue(queue); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var reqs []Request
	if !s.decode(w, r, MaxBatchBody(s.opts.Limits.MaxPayload), &reqs) {
		return
	}
	if len(reqs) > MaxBatch {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("%d resets in one body; send at most %d per request", len(reqs), MaxBatch))
		return
	}
	now := s.opts.Now()
	rs := make([]shard.TimerReset, len(reqs))
	for j, req := range reqs {
		tr, err := s.opts.Limits.Reset(queue, req.ID, req, now)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("timer %d: %v; nothing was stored", j, err))
			return
		}
		rs[j] = tr
	}
	if err := s.Reset(r.Context(), rs); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	s.Stored("http", len(rs))
	writeJSON(w, http.StatusOK, map[string]any{"queue": queue, "stored": len(rs)})
}

// checkName refuses a queue or an id no reset could have stored.
func (s *Service) checkName(queue, id string) error {
	if err := CheckQueue(queue); err != nil {
		return err
	}
	if err := shard.CheckID(id, s.opts.Limits.MaxIDLen); err != nil {
		return fmt.Errorf("%w: id: %w", ErrBadTimer, err)
	}
	return nil
}

// decode reads a JSON body of at most limit bytes into v, or answers the
// request with what is wrong.
func (s *Service) decode(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit)).Decode(v)
	switch {
	case err == nil:
		return true
	case errors.As(err, new(*http.MaxBytesError)):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes (timers.max_payload is %d); send a larger batch in several requests", limit, s.opts.Limits.MaxPayload))
	default:
		writeError(w, http.StatusBadRequest, `body must be JSON: {"after": "30s" | "at": unix-ms, "mode": "extend" | "set", "payload": any JSON} (an array of them, each with "id", for a batch): `+err.Error())
	}
	return false
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
