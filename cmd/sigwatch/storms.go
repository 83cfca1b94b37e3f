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
	"text/tabwriter"

	"github.com/sigwatch/sigwatch/api"
)

// cmdStorm lists storms and acknowledges their alarms through the API.
func cmdStorm(ctx context.Context, args []string, stdout io.Writer) error {
	const use = "usage: sigwatch storm [--api URL] ls [--json] | ack <group>|--fleet [--for 30m | --until T]"
	fs := flag.NewFlagSet("storm", flag.ContinueOnError)
	base, token := apiFlags(fs)
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
		return stormLs(ctx, *base, *token, *asJSON, stdout)
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
		return callAPI(ctx, http.MethodPost, *base+path, *token, body, stdout)
	}
	return errors.New(use)
}

func stormLs(ctx context.Context, base, token string, asJSON bool, stdout io.Writer) error {
	body, err := getAPI(ctx, base+"/v1/storms", token)
	if err != nil {
		return err
	}
	var l api.StormList
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
