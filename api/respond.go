package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/timer"
)

// writeJSON is the one writer of a JSON answer.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers {"error": msg}, the body every refusal has.
func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

// errStatus is the one mapping of domain errors to HTTP status codes: a
// refusal the caller can act on is 4xx, anything else means a dependency
// (Redis, NATS) is not answering.
func errStatus(err error) int {
	switch {
	case errors.Is(err, ingest.ErrEmptyID), errors.Is(err, ingest.ErrIDTooLong), errors.Is(err, ingest.ErrBadID),
		errors.Is(err, ingest.ErrReservedID), errors.Is(err, alarm.ErrBadMute),
		errors.Is(err, shard.ErrBadCursor), errors.Is(err, shard.ErrBadQuery), errors.Is(err, alarm.ErrBadQuery),
		errors.Is(err, timer.ErrBadQueue), errors.Is(err, timer.ErrBadTimer), errors.Is(err, timer.ErrBadPayload):
		return http.StatusBadRequest
	case errors.Is(err, alarm.ErrNoAlarm), errors.Is(err, shard.ErrDraining):
		return http.StatusConflict
	}
	return http.StatusServiceUnavailable
}

// writeErr answers err with the status errStatus gives it.
func writeErr(w http.ResponseWriter, err error) { writeError(w, errStatus(err), err.Error()) }

// defaultLimit is the page size of a listing that names none.
const defaultLimit = 100

// limit reads the limit of a listing: 1 to most, defaultLimit when absent.
func limit(r *http.Request, most int) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return defaultLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > most {
		return 0, fmt.Errorf("limit %q: give a number from 1 to %d", v, most)
	}
	return n, nil
}

// validID refuses ids ingest would refuse, with the one check MQTT and
// HTTP share, so the API cannot create devices MQTT never could.
func (a *API) validID(id string) error {
	err := shard.CheckID(id, a.o.MaxIDLen)
	if errors.Is(err, ingest.ErrIDTooLong) {
		return fmt.Errorf("%w: %d bytes, the limit is %d (ingest.max_id_len)", err, len(id), a.o.MaxIDLen)
	}
	return err
}
