package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"text/tabwriter"

	"github.com/sigwatch/sigwatch/api"
)

// cmdAudit lists the most recent state-changing API calls, newest first:
// sigwatch audit [--limit N] [--json].
func cmdAudit(ctx context.Context, args []string, stdout io.Writer) error {
	const use = "usage: sigwatch audit [--api URL] [--limit N] [--json]"
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	c := apiFlags(fs)
	n := fs.Int("limit", 100, "how many of the most recent records to list (at most 1000)")
	asJSON := fs.Bool("json", false, "print the JSON of GET /v1/audit")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s", use)
	}
	var l api.AuditList
	q := url.Values{"limit": {strconv.Itoa(*n)}}
	if err := c.getJSON(ctx, "/v1/audit?"+q.Encode(), &l); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, l)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tWHO\tROLE\tACTION\tTARGET\tSTATUS\tOUTCOME")
	for _, r := range l.Records {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", msTime(r.At), r.Who, r.Role, r.Action, orDash(r.Target), r.Status, r.Outcome)
	}
	return tw.Flush()
}
