package api

import (
	"net/http"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/shard"
)

// DeviceList is the body of GET /v1/devices.
type DeviceList struct {
	Devices []shard.ListedDevice `json:"devices"`
	Next    string               `json:"next,omitempty"`
}

// AlarmList is the body of GET /v1/alarms.
type AlarmList struct {
	Alarms []alarm.Listed `json:"alarms"`
	Next   string         `json:"next,omitempty"`
}

// getDevices is GET /v1/devices?state=lost|watched&type=T&limit=N&cursor=C:
// one page of devices and the cursor of the next ("next", absent on the
// last page). Without state it lists every known device, the watched ones
// first.
func (a *API) getDevices(w http.ResponseWriter, r *http.Request) {
	n, err := limit(r, shard.MaxListLimit)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	q := r.URL.Query()
	rows, next, err := a.o.Devices.List(r.Context(), shard.DeviceQuery{State: q.Get("state"), Type: q.Get("type"),
		Cursor: q.Get("cursor"), Limit: n})
	if err != nil {
		writeErr(w, err)
		return
	}
	if rows == nil {
		rows = []shard.ListedDevice{}
	}
	writeJSON(w, http.StatusOK, DeviceList{Devices: rows, Next: next})
}

// getAlarms is GET /v1/alarms?state=active|acked|muted|flapping|held&type=T&
// group=G&limit=N&cursor=C: one page of open alarms, as getDevices pages.
// state may name several states, comma-separated (state=active,acked: the
// alarms that are not held).
func (a *API) getAlarms(w http.ResponseWriter, r *http.Request) {
	n, err := limit(r, shard.MaxListLimit)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	q := r.URL.Query()
	rows, next, err := a.o.Alarms.List(r.Context(), alarm.Query{State: q.Get("state"), Type: q.Get("type"),
		Group: q.Get("group"), Cursor: q.Get("cursor"), Limit: n})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, AlarmList{Alarms: rows, Next: next})
}
