package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
)

// apiFlags are the flags of every command that talks to the HTTP API.
func apiFlags(fs *flag.FlagSet) (api, token *string) {
	api = fs.String("api", envOr("SIGWATCH_API", "http://127.0.0.1:8080"), "sigwatch API base URL (env SIGWATCH_API)")
	token = fs.String("token", os.Getenv("SIGWATCH_HTTP_TOKEN"), "API bearer token (env SIGWATCH_HTTP_TOKEN)")
	return api, token
}

// verbArgs splits a command's args into its verb and the positional
// arguments after it, parsing the flags of fs wherever they stand among
// them. Without a verb it returns use as the error.
func verbArgs(fs *flag.FlagSet, args []string, use string) (verb string, pos []string, err error) {
	if len(args) < 1 {
		return "", nil, errors.New(use)
	}
	pos, err = parseAll(fs, args[1:])
	return args[0], pos, err
}

// parseAll parses flags given before, between and after the positional
// arguments, and returns the positional ones.
func parseAll(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// cmdDevice talks to a running sigwatch's HTTP API.
func cmdDevice(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "ls" {
		return cmdDeviceList(ctx, args[1:], stdout)
	}
	fs := flag.NewFlagSet("device", flag.ContinueOnError)
	api, token := apiFlags(fs)
	ackFor := fs.String("for", "", "ack: pause the alarm's repeats for this long (e.g. 30m) instead of resolving it")
	ackUntil := fs.String("until", "", "ack: pause the alarm's repeats until this time (RFC 3339 or unix ms)")
	const use = "usage: sigwatch device [--api URL] get|rm <id> | threshold <id> <duration> | group <id> <group> (empty removes) | ack <id> [--for 30m | --until T] | ls [--state lost|watched] [--type T] [--all] [--json]"
	verb, pos, err := verbArgs(fs, args, use)
	if err != nil {
		return err
	}
	if len(pos) < 1 {
		return errors.New(use)
	}
	id := url.PathEscape(pos[0])
	var method, path string
	var body []byte
	switch verb {
	case "get":
		method, path = http.MethodGet, "/v1/devices/"+id
	case "rm":
		method, path = http.MethodDelete, "/v1/devices/"+id
	case "threshold":
		if len(pos) < 2 {
			return errors.New(use)
		}
		method, path = http.MethodPut, "/v1/devices/"+id+"/threshold"
		body, _ = json.Marshal(map[string]string{"threshold": pos[1]})
	case "group":
		if len(pos) < 2 {
			return errors.New(use)
		}
		method, path = http.MethodPut, "/v1/devices/"+id+"/group"
		body, _ = json.Marshal(map[string]string{"group": pos[1]})
	case "ack":
		method, path = http.MethodPost, "/v1/devices/"+id+"/ack"
		b := map[string]string{}
		if *ackFor != "" {
			b["for"] = *ackFor
		}
		if *ackUntil != "" {
			b["until"] = *ackUntil
		}
		body, _ = json.Marshal(b)
	default:
		return errors.New(use)
	}
	return callAPI(ctx, method, *api+path, *token, body, stdout)
}

// cmdMute adds, lists and removes alarm mutes through the HTTP API.
func cmdMute(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("mute", flag.ContinueOnError)
	api, token := apiFlags(fs)
	device := fs.String("device", "", "add: mute this device")
	typ := fs.String("type", "", "add: mute every device of this type")
	dur := fs.String("for", "", "add: for this long (e.g. 1h)")
	until := fs.String("until", "", "add: until this time (RFC 3339 or unix ms)")
	comment := fs.String("comment", "", "add: why")
	const use = "usage: sigwatch mute [--api URL] add (--device ID | --type T) (--for 1h | --until T) [--comment text] | ls | rm <id>"
	verb, pos, err := verbArgs(fs, args, use)
	if err != nil {
		return err
	}
	switch {
	case verb == "add" && len(pos) == 0:
		b := map[string]string{"device": *device, "type": *typ, "for": *dur, "until": *until, "comment": *comment}
		for k, v := range b {
			if v == "" {
				delete(b, k)
			}
		}
		body, _ := json.Marshal(b)
		return callAPI(ctx, http.MethodPost, *api+"/v1/mutes", *token, body, stdout)
	case verb == "ls" && len(pos) == 0:
		return callAPI(ctx, http.MethodGet, *api+"/v1/mutes", *token, nil, stdout)
	case verb == "rm" && len(pos) == 1:
		return callAPI(ctx, http.MethodDelete, *api+"/v1/mutes/"+url.PathEscape(pos[0]), *token, nil, stdout)
	}
	return errors.New(use)
}

func callAPI(ctx context.Context, method, u, token string, body []byte, stdout io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%w (is sigwatch running with the api role? set --api)", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") == nil {
		b = append(out.Bytes(), '\n')
	}
	_, err = stdout.Write(b)
	return err
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
