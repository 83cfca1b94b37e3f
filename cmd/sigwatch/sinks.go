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

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/sinks"
)

// cmdSink lists the sinks and sends a test notification through one.
func cmdSink(ctx context.Context, args []string, stdout io.Writer) error {
	const use = "usage: sigwatch sink [--api URL] ls [--json] | test <name> [--json]"
	fs := flag.NewFlagSet("sink", flag.ContinueOnError)
	c := apiFlags(fs)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	verb, pos, err := verbArgs(fs, args, use)
	if err != nil {
		return err
	}
	switch verb {
	case "ls":
		if len(pos) > 0 {
			return errors.New(use)
		}
		var l api.SinkList
		if err := c.getJSON(ctx, "/v1/sinks", &l); err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, l)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tTYPE\tSTATE\tQUEUE\tRATE/S\tLAST SENT\tLAST ERROR")
		for _, s := range l.Sinks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%g\t%s\t%s\n", s.Name, s.Type, s.State, s.Queue, s.Rate, msTime(s.LastSent), orDash(s.LastError))
		}
		return tw.Flush()
	case "test":
		if len(pos) != 1 {
			return errors.New(use)
		}
		var res sinks.TestResult
		err := c.show(ctx, http.MethodPost, "/v1/sinks/"+url.PathEscape(pos[0])+"/test", nil, &res, *asJSON, stdout, func() {
			if res.OK {
				fmt.Fprintf(stdout, "sink %s took the test notification %s\n", res.Sink, res.ID)
			} else {
				fmt.Fprintf(stdout, "sink %s refused the test notification %s: %s\n", res.Sink, res.ID, res.Error)
			}
		})
		if err == nil && !res.OK && !*asJSON {
			return fmt.Errorf("sink %s did not take the test notification", res.Sink)
		}
		return err
	}
	return errors.New(use)
}
