package api

import (
	"errors"
	"net/http"

	"github.com/sigwatch/sigwatch/sinks"
)

// SinkList is the body of GET /v1/sinks.
type SinkList struct {
	Sinks []sinks.View `json:"sinks"`
}

// getSinks is GET /v1/sinks: each configured sink's state (ok, retrying,
// disabled), queue, budget, last error and last delivery.
func (a *API) getSinks(w http.ResponseWriter, r *http.Request) {
	list := []sinks.View{}
	if a.o.Sinks != nil {
		var err error
		if list, err = a.o.Sinks.List(r.Context()); err != nil {
			writeErr(w, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, SinkList{Sinks: list})
}

// postSinkTest is POST /v1/sinks/{name}/test: a clearly marked test
// notification, sent at once, and the sink's answer (200 either way; the
// body says whether the sink took it).
func (a *API) postSinkTest(w http.ResponseWriter, r *http.Request) {
	if a.o.Sinks == nil {
		writeError(w, http.StatusNotFound, "no sinks are configured")
		return
	}
	res, err := a.o.Sinks.Test(r.Context(), r.PathValue("name"))
	if errors.Is(err, sinks.ErrUnknown) {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
