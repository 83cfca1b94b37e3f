package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/sigwatch/sigwatch/alarm"
)

// StormList is the body of GET /v1/storms.
type StormList struct {
	Storms []alarm.StormView `json:"storms"`
}

// maxStorms bounds the limit of GET /v1/storms.
const maxStorms = 1000

// getStorms is GET /v1/storms[?limit=N]: the storms going on, then the
// latest ended ones.
func (a *API) getStorms(w http.ResponseWriter, r *http.Request) {
	n, err := limit(r, maxStorms)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	storms, err := a.o.Alarms.Storms(r.Context(), n)
	if err != nil {
		writeErr(w, err)
		return
	}
	if storms == nil {
		storms = []alarm.StormView{}
	}
	writeJSON(w, http.StatusOK, StormList{Storms: storms})
}

// postGroupAck is POST /v1/groups/{group}/ack, and postFleetAck POST
// /v1/fleet/ack: they acknowledge the alarm of a group's or the fleet's
// storm as POST /v1/devices/{id}/ack does a device's.
func (a *API) postGroupAck(w http.ResponseWriter, r *http.Request) {
	g := r.PathValue("group")
	if err := a.validID(g); err != nil {
		writeError(w, http.StatusBadRequest, "group: "+err.Error())
		return
	}
	a.ackScope(w, r, g)
}

func (a *API) postFleetAck(w http.ResponseWriter, r *http.Request) { a.ackScope(w, r, "") }

func (a *API) ackScope(w http.ResponseWriter, r *http.Request, group string) {
	until, ok := a.ackUntil(w, r)
	if !ok {
		return
	}
	v, err := a.o.Alarms.AckScope(r.Context(), group, until, callerOf(r.Context()).Name)
	switch {
	case errors.Is(err, alarm.ErrNoAlarm) && group == "":
		writeError(w, http.StatusConflict, "the fleet has no open storm alarm")
	case errors.Is(err, alarm.ErrNoAlarm):
		writeError(w, http.StatusConflict, fmt.Sprintf("group %s has no open storm alarm", group))
	case err != nil:
		writeErr(w, err)
	default:
		writeJSON(w, http.StatusOK, v)
	}
}
