package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/api"
)

// cmdStorm lists storms and acknowledges their alarms through the API.
func cmdStorm(ctx context.Context, args []string, stdout io.Writer) error {
	const use = "usage: sigwatch storm [--api URL] ls [--json] | ack <group>|--fleet [--for 30m | --until T]"
	fs := flag.NewFlagSet("storm", flag.ContinueOnError)
	c := apiFlags(fs)
	asJSON := fs.Bool("json", false, "print the API's JSON")
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
		return stormLs(ctx, c, *asJSON, stdout)
	case "ack":
		path, who := "/v1/fleet/ack", "the fleet's storm"
		switch {
		case *fleet && len(pos) == 0:
		case !*fleet && len(pos) == 1:
			path, who = "/v1/groups/"+url.PathEscape(pos[0])+"/ack", "group "+pos[0]+"'s storm"
		default:
			return errors.New(use)
		}
		var v alarm.View
		return c.show(ctx, http.MethodPost, path, ackBody(*ackFor, *ackUntil), &v, *asJSON, stdout, func() { printAck(stdout, who, v) })
	}
	return errors.New(use)
}

func stormLs(ctx context.Context, c *apiClient, asJSON bool, stdout io.Writer) error {
	var l api.StormList
	if err := c.getJSON(ctx, "/v1/storms", &l); err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, l)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	// An active storm's counts are the scope's now; an ended one's those
	// of its end.
	fmt.Fprintln(tw, "SCOPE\tGROUP\tSTATE\tLOST\tWATCHED\tHELD\tSINCE\tENDED\tALARM")
	for _, s := range l.Storms {
		lost, watched := s.Lost, s.Size
		if s.State != alarm.StormActive {
			lost, watched = s.Devices, s.Watched
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", s.Scope, orDash(s.Group), s.State, lost, watched, s.Held,
			msTime(s.Since), msTime(s.Ended), orDash(s.Alarm.State))
	}
	return tw.Flush()
}
