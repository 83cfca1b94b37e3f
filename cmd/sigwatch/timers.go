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
	"time"
)

// storedTimer is a timer as the API answers it.
type storedTimer struct {
	Queue    string          `json:"queue"`
	ID       string          `json:"id"`
	Deadline int64           `json:"deadline"`
	Payload  json.RawMessage `json:"payload,omitempty"`
}

// cmdTimer sets, reads and cancels generic timers through the HTTP API.
func cmdTimer(ctx context.Context, args []string, stdout io.Writer) error {
	const use = "usage: sigwatch timer [--api URL] [--json] get <queue> <id> | set <queue> <id> (--after 30s | --at unix-ms) [--mode set] [--payload JSON] | rm <queue> <id>"
	fs := flag.NewFlagSet("timer", flag.ContinueOnError)
	c := apiFlags(fs)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	after := fs.String("after", "", "set: fire after this long (e.g. 30s)")
	at := fs.Int64("at", 0, "set: fire at this unix time in ms")
	mode := fs.String("mode", "", "set: extend (default: only ever later) or set (exact)")
	payload := fs.String("payload", "", "set: the timer's payload, any JSON (null removes it)")
	verb, pos, err := verbArgs(fs, args, use)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return errors.New(use)
	}
	path := "/v1/timers/" + url.PathEscape(pos[0]) + "/" + url.PathEscape(pos[1])
	var tm storedTimer
	show := func() { printTimer(stdout, tm) }
	switch verb {
	case "get":
		return c.show(ctx, http.MethodGet, path, nil, &tm, *asJSON, stdout, show)
	case "rm":
		b, err := c.do(ctx, http.MethodDelete, path, nil)
		if err != nil {
			return err
		}
		if *asJSON {
			return printRaw(stdout, b)
		}
		_, err = fmt.Fprintf(stdout, "timer %s of queue %s cancelled\n", strconv.Quote(pos[1]), pos[0])
		return err
	case "set":
		b := map[string]any{}
		if *after != "" {
			b["after"] = *after
		}
		if *at != 0 {
			b["at"] = *at
		}
		if *mode != "" {
			b["mode"] = *mode
		}
		if *payload != "" {
			if !json.Valid([]byte(*payload)) {
				return fmt.Errorf("--payload %q is not JSON", *payload)
			}
			b["payload"] = json.RawMessage(*payload)
		}
		return c.show(ctx, http.MethodPut, path, b, &tm, *asJSON, stdout, show)
	}
	return errors.New(use)
}

// printTimer writes the human form of a stored timer.
func printTimer(w io.Writer, tm storedTimer) {
	in := time.Until(time.UnixMilli(tm.Deadline)).Round(time.Second)
	when := "in " + in.String()
	if in <= 0 {
		when = "due now"
	}
	fmt.Fprintf(w, "timer %s of queue %s fires at %s (%s)\n", strconv.Quote(tm.ID), tm.Queue, msTime(tm.Deadline), when)
	if len(tm.Payload) > 0 && string(tm.Payload) != "null" {
		fmt.Fprintf(w, "payload %s\n", tm.Payload)
	}
}
