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
)

// cmdTimer sets, reads and cancels generic timers through the HTTP API.
func cmdTimer(ctx context.Context, args []string, stdout io.Writer) error {
	const use = "usage: sigwatch timer [--api URL] get <queue> <id> | set <queue> <id> (--after 30s | --at unix-ms) [--mode set] [--payload JSON] | rm <queue> <id>"
	fs := flag.NewFlagSet("timer", flag.ContinueOnError)
	api, token := apiFlags(fs)
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
	path := *api + "/v1/timers/" + url.PathEscape(pos[0]) + "/" + url.PathEscape(pos[1])
	switch verb {
	case "get":
		return callAPI(ctx, http.MethodGet, path, *token, nil, stdout)
	case "rm":
		if err := callAPI(ctx, http.MethodDelete, path, *token, nil, io.Discard); err != nil {
			return err
		}
		_, err := fmt.Fprintf(stdout, "timer %s of queue %s cancelled\n", strconv.Quote(pos[1]), pos[0])
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
		body, _ := json.Marshal(b)
		return callAPI(ctx, http.MethodPut, path, *token, body, stdout)
	}
	return errors.New(use)
}
