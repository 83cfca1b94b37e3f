package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
)

// MaxLast bounds GET /v1/events?last=N.
const MaxLast = 10000

// keepAlive is how often an idle event stream sends a comment line, so
// that a reader (and any proxy) can tell a quiet stream from a dead one.
const keepAlive = 15 * time.Second

// getEvents is GET /v1/events: the events of the stream as Server-Sent
// Events, one per message: "id: <stream sequence>", "event: <name>"
// (lost, recovered, alarm, storm, system, timer, invalid), "data: <the
// event's JSON body>". It starts with the next new event; ?since=10m or
// ?last=N start earlier, and Last-Event-ID (or ?after=<sequence>) resumes
// after an event read before. ?kind=lost,alarms,storms,system,timers,invalid
// (repeatable or comma-separated) and ?device=<id> filter.
func (a *API) getEvents(w http.ResponseWriter, r *http.Request) {
	if a.o.Pub == nil {
		writeError(w, http.StatusServiceUnavailable, "no NATS connection in this process")
		return
	}
	o, err := a.followOptions(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, "this server cannot stream")
		return
	}
	es, err := a.o.Pub.Follow(r.Context(), o)
	switch {
	case errors.Is(err, dispatch.ErrBadKind):
		writeError(w, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, plain(err))
		return
	}
	defer es.Stop()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	for {
		ev, ok, err := es.Next(r.Context(), keepAlive)
		switch {
		case err != nil:
			if r.Context().Err() == nil {
				// The client sees the stream end and resumes with
				// Last-Event-ID.
				fmt.Fprintf(w, ": stream broke: %s\n\n", oneLine(err.Error()))
				flusher.Flush()
			}
			return
		case !ok:
			_, err = fmt.Fprint(w, ": keep-alive\n\n")
		default:
			_, err = fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.Seq, ev.Name, oneLine(string(ev.Body)))
		}
		if err != nil {
			return
		}
		flusher.Flush()
	}
}

// oneLine keeps a data line one line: JSON bodies hold no raw newline, but
// nothing else may break the framing either.
func oneLine(s string) string { return strings.NewReplacer("\r", " ", "\n", " ").Replace(s) }

// followOptions reads the query of GET /v1/events.
func (a *API) followOptions(r *http.Request) (dispatch.FollowOptions, error) {
	q := r.URL.Query()
	var o dispatch.FollowOptions
	for _, k := range q["kind"] {
		for _, k := range strings.Split(k, ",") {
			if k = strings.TrimSpace(k); k != "" {
				o.Kinds = append(o.Kinds, k)
			}
		}
	}
	if id := q.Get("device"); id != "" {
		if err := a.validID(id); err != nil {
			return o, fmt.Errorf("device: %w", err)
		}
		o.Device = id
	}
	after := r.Header.Get("Last-Event-ID")
	if v := q.Get("after"); v != "" {
		after = v
	}
	if after != "" {
		n, err := strconv.ParseUint(after, 10, 64)
		if err != nil {
			return o, fmt.Errorf("after (Last-Event-ID) %q: give the id of an event read before", after)
		}
		o.After = n
	}
	since, last := q.Get("since"), q.Get("last")
	if since != "" && last != "" {
		return o, errors.New("give since or last, not both")
	}
	if since != "" {
		d, err := time.ParseDuration(since)
		if err != nil || d <= 0 {
			return o, fmt.Errorf("since %q: give a duration such as 10m or 2h", since)
		}
		o.Since = a.o.Now().Add(-d)
	}
	if last != "" {
		n, err := strconv.Atoi(last)
		if err != nil || n < 1 || n > MaxLast {
			return o, fmt.Errorf("last %q: give a number from 1 to %d", last, MaxLast)
		}
		o.Last = n
	}
	return o, nil
}
