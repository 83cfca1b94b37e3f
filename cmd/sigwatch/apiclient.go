package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// defaultTimeout bounds every call of a CLI verb to the API: longer than the
// API's own http.request_timeout (10s), so that its 503 saying why arrives first.
const defaultTimeout = 15 * time.Second

// apiClient is the HTTP API as every CLI verb reaches it: --api, --token,
// --timeout and the TLS flags, one deadline per call, and one-line errors.
type apiClient struct {
	base, token *string
	timeout     *time.Duration
	tls         tlsFlags
	hc          *http.Client // built from tls at the first call
}

// apiFlags adds the flags of every command that talks to the HTTP API.
func apiFlags(fs *flag.FlagSet) *apiClient {
	c := &apiClient{
		base:    fs.String("api", envOr("SIGWATCH_API", "http://127.0.0.1:8080"), "sigwatch API base URL (env SIGWATCH_API)"),
		token:   fs.String("token", os.Getenv("SIGWATCH_HTTP_TOKEN"), "API bearer token (env SIGWATCH_HTTP_TOKEN)"),
		timeout: new(time.Duration),
		tls: tlsFlags{
			ca:   fs.String("ca", os.Getenv("SIGWATCH_API_CA"), "CA certificate (PEM) to verify an https --api with, beside the system's (env SIGWATCH_API_CA)"),
			cert: fs.String("cert", os.Getenv("SIGWATCH_API_CERT"), "client certificate (PEM) for an API with mutual TLS (env SIGWATCH_API_CERT)"),
			key:  fs.String("key", os.Getenv("SIGWATCH_API_KEY"), "its private key (PEM) (env SIGWATCH_API_KEY)"),
		},
	}
	*c.timeout = defaultTimeout
	if d, err := time.ParseDuration(os.Getenv("SIGWATCH_TIMEOUT")); err == nil && d > 0 {
		*c.timeout = d
	}
	fs.DurationVar(c.timeout, "timeout", *c.timeout, "give up on the API after this long (env SIGWATCH_TIMEOUT)")
	return c
}

// request builds a call of method on path with the token.
func (c *apiClient) request(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	if _, err := c.httpClient(); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(*c.base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("--api %q: %v", *c.base, errors.Unwrap(err))
	}
	if *c.token != "" {
		req.Header.Set("Authorization", "Bearer "+*c.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// do calls method on path with body (nil: none) within the timeout and
// returns the answer's body, or the API's refusal as the error.
func (c *apiClient) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, *c.timeout)
	defer cancel()
	req, err := c.request(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.transportError(ctx, method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, c.transportError(ctx, method, path, err)
	}
	if resp.StatusCode >= 300 {
		return nil, c.refusal(resp, b)
	}
	return b, nil
}

// getJSON decodes the answer of GET path into v.
func (c *apiClient) getJSON(ctx context.Context, path string, v any) error {
	return c.callJSON(ctx, http.MethodGet, path, nil, v)
}

// callJSON calls method on path with in as JSON (nil: no body) and decodes
// the answer into out (nil: dropped).
func (c *apiClient) callJSON(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		body, _ = json.Marshal(in)
	}
	b, err := c.do(ctx, method, path, body)
	if err != nil || out == nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("the API at %s answered %s %s with something unexpected (is it sigwatch, of the same version?)", *c.base, method, path)
	}
	return nil
}

// transportError says in one line why a call got no answer.
func (c *apiClient) transportError(ctx context.Context, method, path string, err error) error {
	var op *net.OpError
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("no answer from the API at %s to %s %s within %v (--timeout, SIGWATCH_TIMEOUT)", *c.base, method, path, *c.timeout)
	case errors.Is(err, context.Canceled):
		return errors.New("interrupted")
	case errors.As(err, &op) && op.Op == "dial":
		return fmt.Errorf("cannot reach the API at %s: is sigwatch running with the api role? (set --api or SIGWATCH_API)", *c.base)
	case c.tlsError(err) != "":
		return errors.New(c.tlsError(err))
	}
	return fmt.Errorf("the API at %s: %v", *c.base, errors.Unwrap(err))
}

// refusal is an answer other than success: the API's own message (its
// JSON {"error": ...}); anything else did not come from sigwatch, and the
// error says what came and where to point the CLI instead.
func (c *apiClient) refusal(resp *http.Response, body []byte) error {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return errors.New(e.Error)
	}
	what := "an empty body"
	trimmed := strings.TrimSpace(string(body))
	if strings.Contains(trimmed, "HTTP request to an HTTPS server") {
		return fmt.Errorf("the API at %s serves HTTPS: use https:// in --api (and --ca if its CA is not one this host trusts)", *c.base)
	}
	switch ct := resp.Header.Get("Content-Type"); {
	case strings.HasPrefix(ct, "text/html") || strings.HasPrefix(trimmed, "<"):
		what = "an HTML page"
	case json.Valid(body):
		what = "JSON that is not sigwatch's"
	case trimmed != "":
		line, _, _ := strings.Cut(trimmed, "\n")
		if len(line) > 80 {
			line = line[:80] + "..."
		}
		what = fmt.Sprintf("%q", line)
	}
	return fmt.Errorf("the API at %s answered %d with %s: is that sigwatch? (set --api or SIGWATCH_API)", *c.base, resp.StatusCode, what)
}

// printJSON writes v indented, for --json.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printRaw writes a JSON answer indented, for --json.
func printRaw(w io.Writer, b []byte) error {
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") != nil {
		_, err := w.Write(b)
		return err
	}
	out.WriteByte('\n')
	_, err := w.Write(out.Bytes())
	return err
}

// msTime shows a unix ms time in local time: the clock alone today, the
// date too otherwise; "-" for none.
func msTime(ms int64) string {
	if ms <= 0 {
		return "-"
	}
	return localTime(time.UnixMilli(ms))
}

func localTime(t time.Time) string {
	t, now := t.Local(), time.Now().Local()
	if t.Year() == now.Year() && t.YearDay() == now.YearDay() {
		return t.Format("15:04:05")
	}
	return t.Format("2006-01-02 15:04:05")
}

// msAgo shows a duration in ms as a rounded human duration.
func msAgo(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d < time.Second:
		return d.String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
