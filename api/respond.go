package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

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

// writeErr answers err with the status errStatus gives it, in plain words.
func writeErr(w http.ResponseWriter, err error) { writeError(w, errStatus(err), plain(err)) }

// packages are the module's packages whose names start the parts of a
// wrapped error, as the logs want them and the API's callers do not.
var packages = []string{"shard", "queue", "alarm", "timer", "ingest", "dispatch", "scanner", "guard", "stats"}

// plain is err's text without the package names that start its parts
// ("shard: list: read registry: x" reads "list: read registry: x").
func plain(err error) string {
	parts := strings.Split(err.Error(), ": ")
	out := parts[:0]
	for j, p := range parts {
		if j == len(parts)-1 || !slices.Contains(packages, p) {
			out = append(out, p)
		}
	}
	return strings.Join(out, ": ")
}

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

// jsonMisses answers what mux has no route for, or no route with that
// method for, in the JSON every refusal has, instead of the mux's plain
// text.
func jsonMisses(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(&missWriter{ResponseWriter: w, r: r}, r)
	})
}

// missWriter turns the mux's plain-text 404 and 405 into JSON.
type missWriter struct {
	http.ResponseWriter
	r       *http.Request
	swallow bool
}

func (m *missWriter) WriteHeader(code int) {
	plain := strings.HasPrefix(m.Header().Get("Content-Type"), "text/plain")
	switch {
	case code == http.StatusNotFound && plain:
		m.swallow = true
		writeError(m.ResponseWriter, code, fmt.Sprintf("no route %s %s", m.r.Method, m.r.URL.Path))
	case code == http.StatusMethodNotAllowed && plain:
		m.swallow = true
		writeError(m.ResponseWriter, code, fmt.Sprintf("%s is not allowed on %s: use %s", m.r.Method, m.r.URL.Path, m.Header().Get("Allow")))
	default:
		m.ResponseWriter.WriteHeader(code)
	}
}

func (m *missWriter) Write(b []byte) (int, error) {
	if m.swallow {
		return len(b), nil
	}
	return m.ResponseWriter.Write(b)
}

// decodeBody reads a JSON body of at most limit bytes into v, refusing a
// field v does not have, so a typo is named instead of ignored. Its error
// says what is wrong in the caller's words; io.EOF (no body) and
// *http.MaxBytesError pass as they are.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case err == nil, errors.Is(err, io.EOF), errors.As(err, new(*http.MaxBytesError)):
		return err
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return errors.New(strings.TrimPrefix(err.Error(), "json: "))
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return fmt.Errorf("field %q cannot be a JSON %s", typeErr.Field, typeErr.Value)
	case errors.As(err, &typeErr):
		return fmt.Errorf("the body cannot be a JSON %s", typeErr.Value)
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("the body is not valid JSON")
	}
	return errors.New(strings.TrimPrefix(err.Error(), "json: "))
}

// refusal is the message of a body refused: what is wrong, then use.
func refusal(err error, use string) string {
	if err == nil || errors.Is(err, io.EOF) {
		return use
	}
	return err.Error() + ": " + use
}
