package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// Type is what GET, PUT and DELETE /v1/types/{type} answer: the threshold
// and confirm_after in force for the type and where each comes from
// (runtime, config, default); after a change, how many watched devices'
// deadlines it moved.
type Type struct {
	shard.TypeView
	Moved int `json:"moved,omitempty"`
}

// TypeList is what GET /v1/types answers: every type with a setting, at
// run time or in the configuration.
type TypeList struct {
	Types []shard.TypeView `json:"types"`
}

// validType refuses a type ingest would refuse, and the empty one (the
// default type's threshold is thresholds.default).
func (a *API) validType(w http.ResponseWriter, typ string) bool {
	if typ == "" {
		writeError(w, http.StatusBadRequest, "give a device type: /v1/types/{type}")
		return false
	}
	if err := shard.CheckType(typ, a.o.MaxIDLen); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return false
	}
	return true
}

func (a *API) getTypes(w http.ResponseWriter, r *http.Request) {
	ts, err := a.o.Devices.Types(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, TypeList{Types: ts})
}

func (a *API) getType(w http.ResponseWriter, r *http.Request) {
	typ := r.PathValue("type")
	if !a.validType(w, typ) {
		return
	}
	v, err := a.o.Devices.Type(r.Context(), typ)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, Type{TypeView: v})
}

const typeUse = `body must be {"threshold": "10m", "confirm_after": "30s"}, either field alone ("" removes it)`

// putType is PUT /v1/types/{type}: a field given replaces what is set at
// run time ("" removes it), a field absent keeps it.
func (a *API) putType(w http.ResponseWriter, r *http.Request) {
	typ := r.PathValue("type")
	if !a.validType(w, typ) {
		return
	}
	var body struct {
		Threshold    *string `json:"threshold"`
		ConfirmAfter *string `json:"confirm_after"`
	}
	if err := decodeBody(w, r, 4096, &body); err != nil || body.Threshold == nil && body.ConfirmAfter == nil {
		writeError(w, http.StatusBadRequest, refusal(err, typeUse))
		return
	}
	var thr, conf time.Duration
	if body.Threshold != nil && *body.Threshold != "" {
		var err error
		if thr, err = time.ParseDuration(*body.Threshold); err != nil || thr < time.Millisecond || thr > shard.MaxThreshold {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("threshold %q: give a Go duration such as 90s or 10m, from 1ms to %v (\"\" removes it)", *body.Threshold, shard.MaxThreshold))
			return
		}
	}
	if body.ConfirmAfter != nil && *body.ConfirmAfter != "" {
		var err error
		if conf, err = time.ParseDuration(*body.ConfirmAfter); err != nil || conf < 0 || conf > shard.MaxThreshold {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("confirm_after %q: give a Go duration such as 30s, from 0s to %v (\"\" removes it)", *body.ConfirmAfter, shard.MaxThreshold))
			return
		}
	}
	a.changeType(w, r, typ, func(cur shard.TypeSetting) shard.TypeSetting {
		if body.Threshold != nil {
			cur.Threshold = thr
		}
		if body.ConfirmAfter != nil {
			cur.Confirm, cur.ConfirmSet = conf, *body.ConfirmAfter != ""
		}
		return cur
	})
}

// deleteType is DELETE /v1/types/{type}: back to the configuration's.
func (a *API) deleteType(w http.ResponseWriter, r *http.Request) {
	typ := r.PathValue("type")
	if !a.validType(w, typ) {
		return
	}
	a.changeType(w, r, typ, func(shard.TypeSetting) shard.TypeSetting { return shard.TypeSetting{} })
}

// changeType applies change to typ's run-time setting: the watched devices
// of the type move, Redis stores it, then the durable registry does, all
// before the answer.
func (a *API) changeType(w http.ResponseWriter, r *http.Request, typ string, change func(shard.TypeSetting) shard.TypeSetting) {
	var durable func(shard.TypeSetting) error
	if a.o.Registry != nil {
		durable = func(s shard.TypeSetting) error {
			err := a.o.Registry.PutType(r.Context(), dispatch.TypeRecord{Type: typ, Threshold: s.Threshold.Milliseconds(),
				Confirm: s.Confirm.Milliseconds(), ConfirmSet: s.ConfirmSet})
			if err != nil {
				return fmt.Errorf("registry: %w", err)
			}
			return nil
		}
	}
	v, moved, err := a.o.Devices.SetType(r.Context(), typ, change, durable)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, Type{TypeView: v, Moved: moved})
}
