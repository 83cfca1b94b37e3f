package api

import (
	"net/http"

	"github.com/sigwatch/sigwatch/stats"
)

// Stats is the body of GET /v1/stats.
type Stats = stats.View

// getStats is GET /v1/stats.
func (a *API) getStats(w http.ResponseWriter, r *http.Request) {
	v, err := a.o.Stats.Get(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}
