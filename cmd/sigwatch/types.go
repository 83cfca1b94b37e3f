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
	"github.com/sigwatch/sigwatch/shard"
)

// cmdType reads and sets a device type's thresholds through the API.
func cmdType(ctx context.Context, args []string, stdout io.Writer) error {
	const use = `usage: sigwatch type [--api URL] [--json] ls | get <type> | set <type> [--threshold 10m] [--confirm-after 30s] ("" removes one) | rm <type>`
	fs := flag.NewFlagSet("type", flag.ContinueOnError)
	c := apiFlags(fs)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	thr := fs.String("threshold", "", `set: the type's threshold ("" goes back to the config file's)`)
	conf := fs.String("confirm-after", "", `set: how long an offline report waits ("" goes back to the config file's)`)
	verb, pos, err := verbArgs(fs, args, use)
	if err != nil {
		return err
	}
	if verb == "ls" && len(pos) == 0 {
		var l api.TypeList
		if err := c.getJSON(ctx, "/v1/types", &l); err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, l)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TYPE\tTHRESHOLD\tFROM\tCONFIRM AFTER\tFROM")
		for _, v := range l.Types {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", v.Type, v.Threshold, v.ThresholdFrom, v.ConfirmAfter, v.ConfirmAfterFrom)
		}
		return tw.Flush()
	}
	if len(pos) != 1 {
		return errors.New(use)
	}
	path := "/v1/types/" + url.PathEscape(pos[0])
	var v api.Type
	show := func() { printType(stdout, v) }
	switch verb {
	case "get":
		return c.show(ctx, http.MethodGet, path, nil, &v, *asJSON, stdout, show)
	case "rm":
		return c.show(ctx, http.MethodDelete, path, nil, &v, *asJSON, stdout, show)
	case "set":
		body := map[string]string{}
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "threshold":
				body["threshold"] = *thr
			case "confirm-after":
				body["confirm_after"] = *conf
			}
		})
		if len(body) == 0 {
			return errors.New("give --threshold, --confirm-after or both: " + use)
		}
		return c.show(ctx, http.MethodPut, path, body, &v, *asJSON, stdout, show)
	}
	return errors.New(use)
}

// printType writes the human form of one type's thresholds.
func printType(w io.Writer, v api.Type) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "type\t%s\n", v.Type)
	fmt.Fprintf(tw, "threshold\t%s\t(%s)\n", v.Threshold, from(v.ThresholdFrom))
	fmt.Fprintf(tw, "confirm after\t%s\t(%s)\n", v.ConfirmAfter, from(v.ConfirmAfterFrom))
	if v.Moved > 0 {
		fmt.Fprintf(tw, "moved\t%d watched devices' deadlines\n", v.Moved)
	}
	_ = tw.Flush()
}

// from says where a type's value comes from, in words.
func from(src string) string {
	switch src {
	case shard.FromRuntime:
		return "set at run time"
	case shard.FromConfig:
		return "config file"
	}
	return "default"
}
