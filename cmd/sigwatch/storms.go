package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"

	"github.com/sigwatch/sigwatch/alarm"
)

// stormList is the body of GET /v1/storms.
type stormList struct {
	Storms []alarm.StormView `json:"storms"`
}

// getStorms is GET /v1/storms[?limit=N]: the storms going on, then the
// latest ended ones.
func (a *App) getStorms(w http.ResponseWriter, r *http.Request) {
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q: give a number from 1 to 1000", v))
			return
		}
		limit = n
	}
	storms, err := a.alarms.Storms(r.Context(), limit)
	if err != nil {
		writeErr(w, err)
		return
	}
	if storms == nil {
		storms = []alarm.StormView{}
	}
	writeJSON(w, http.StatusOK, stormList{Storms: storms})
}

// postGroupAck is POST /v1/groups/{group}/ack, and postFleetAck POST
// /v1/fleet/ack: they acknowledge the alarm of a group's or the fleet's
// storm as POST /v1/devices/{id}/ack does a device's.
func (a *App) postGroupAck(w http.ResponseWriter, r *http.Request) {
	g := r.PathValue("group")
	if err := a.validID(g); err != nil {
		writeError(w, http.StatusBadRequest, "group: "+err.Error())
		return
	}
	a.ackScope(w, r, g)
}

func (a *App) postFleetAck(w http.ResponseWriter, r *http.Request) { a.ackScope(w, r, "") }

func (a *App) ackScope(w http.ResponseWriter, r *http.Request, group string) {
	until, ok := a.ackUntil(w, r)
	if !ok {
		return
	}
	v, err := a.alarms.AckScope(r.Context(), group, until)
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

// cmdStorm lists storms and acknowledges their alarms through the API.
func cmdStorm(ctx context.Context, args []string, stdout io.Writer) error {
	const use = "usage: sigwatch storm [--api URL] ls [--json] | ack <group>|--fleet [--for 30m | --until T]"
	fs := flag.NewFlagSet("storm", flag.ContinueOnError)
	api, token := apiFlags(fs)
	asJSON := fs.Bool("json", false, "ls: print the API's JSON")
	fleet := fs.Bool("fleet", false, "ack: the fleet's storm alarm")
	ackFor := fs.String("for", "", "ack: pause the alarm's repeats for this long (e.g. 30m) instead of resolving it")
	ackUntil := fs.String("until", "", "ack: pause the alarm's repeats until this time (RFC 3339 or unix ms)")
	verb, pos, err := verbArgs(fs, args, use)
	if err != nil {
		return err
	}
	switch verb {
	case "ls":
		if len(pos) > 0 {
			return errors.New(use)
		}
		return stormLs(ctx, *api, *token, *asJSON, stdout)
	case "ack":
		path := "/v1/fleet/ack"
		switch {
		case *fleet && len(pos) == 0:
		case !*fleet && len(pos) == 1:
			path = "/v1/groups/" + url.PathEscape(pos[0]) + "/ack"
		default:
			return errors.New(use)
		}
		b := map[string]string{}
		if *ackFor != "" {
			b["for"] = *ackFor
		}
		if *ackUntil != "" {
			b["until"] = *ackUntil
		}
		body, _ := json.Marshal(b)
		return callAPI(ctx, http.MethodPost, *api+path, *token, body, stdout)
	}
	return errors.New(use)
}

func stormLs(ctx context.Context, api, token string, asJSON bool, stdout io.Writer) error {
	body, err := getAPI(ctx, api+"/v1/storms", token)
	if err != nil {
		return err
	}
	var l stormList
	if err := json.Unmarshal(body, &l); err != nil {
		return fmt.Errorf("reading the storm list: %w", err)
	}
	if asJSON {
		return printJSON(stdout, l)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tGROUP\tSTATE\tLOST\tWATCHED\tSINCE\tENDED\tALARM")
	for _, s := range l.Storms {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", s.Scope, orDash(s.Group), s.State, s.Devices, s.Watched,
			msTime(s.Since), msTime(s.Ended), orDash(s.Alarm.State))
	}
	return tw.Flush()
}
