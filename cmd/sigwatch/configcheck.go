package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/api"
)

// cmdConfig is `sigwatch config check [--config F]`: load F (or, without
// one, the defaults) with the environment's SIGWATCH_* overrides and
// validate it, as run would, without connecting to anything; then say
// what was checked and what the process would reach.
func cmdConfig(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		return errors.New("usage: sigwatch config check [--config sigwatch.yaml]")
	}
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	path := fs.String("config", os.Getenv("SIGWATCH_CONFIG"), "YAML config file (env SIGWATCH_CONFIG)")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	cfg, applied, err := loadConfig(*path, os.Environ())
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	writeChecked(stdout, cfg, *path, applied)
	return nil
}

// writeChecked says in a few lines what `config check` checked: the file
// (or the defaults), the variables applied (names only: values may be
// secrets), the roles and the servers the process would use.
func writeChecked(w io.Writer, cfg Config, path string, applied []string) {
	src := "no file (--config or SIGWATCH_CONFIG): the defaults"
	if path != "" {
		src = path
	}
	env := "no SIGWATCH_* settings from the environment"
	if len(applied) > 0 {
		env = "with " + strings.Join(applied, ", ") + " from the environment"
	}
	fmt.Fprintf(w, "checked: %s, %s\n", src, env)
	fmt.Fprintf(w, "roles:   %s\n", strings.Join(cfg.Roles, ", "))
	silence := fmt.Sprintf("lost after %v of silence (thresholds.default)", cfg.Thresholds.Default)
	if types := cfg.Thresholds.Types; len(types) > 0 {
		var each []string
		for _, t := range slices.Sorted(maps.Keys(types)) {
			each = append(each, fmt.Sprintf("%s %v", t, types[t]))
		}
		silence += "; by type (thresholds.types): " + strings.Join(each, ", ")
	}
	fmt.Fprintf(w, "silence: %s\n", silence)
	redis := strings.Join(cfg.Redis.Addrs, ", ")
	if cfg.Redis.Sentinel.MasterSet != "" {
		redis = fmt.Sprintf("master %s from the sentinels %s", cfg.Redis.Sentinel.MasterSet, redis)
	}
	fmt.Fprintf(w, "redis:   %s (key prefix %s)\n", redis, cfg.Redis.Prefix)
	fmt.Fprintf(w, "nats:    %s (%s)\n", cfg.NATS.URL, cfg.NATS.Mode)
	if cfg.hasRole("ingest") {
		fmt.Fprintf(w, "mqtt:    %s as client id %s, topics %s\n", strings.Join(cfg.MQTT.Brokers, ", "), cfg.MQTT.ClientID, strings.Join(cfg.MQTT.Topics, ", "))
	}
	if cfg.hasRole("api") {
		fmt.Fprintf(w, "http:    %s\n", httpSummary(cfg.HTTP))
	}
	if len(cfg.Sinks) > 0 {
		var each []string
		for _, s := range cfg.Sinks {
			each = append(each, fmt.Sprintf("%s (%s)", s.Name, s.Type))
		}
		fmt.Fprintf(w, "sinks:   %s; their secrets are read at start\n", strings.Join(each, ", "))
	}
	fmt.Fprintln(w, "ok: the configuration is valid (nothing was connected to)")
}

// cmdHealthcheck is `sigwatch healthcheck [URL]`: exit 0 when URL (default
// the local /readyz) answers 200. Container images without a shell or curl
// use it as their health check; its errors are one line, like every verb's.
func cmdHealthcheck(ctx context.Context, args []string, stdout io.Writer) error {
	url := "http://127.0.0.1:8080/readyz"
	if len(args) > 0 {
		url = args[0]
	}
	const within = 3 * time.Second
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck URL %q: want e.g. http://127.0.0.1:8080/readyz", url)
	}
	// An https URL is verified as the CLI's verbs verify the API.
	env := func(k string) *string { v := os.Getenv(k); return &v }
	hc := &apiClient{base: &url, tls: tlsFlags{ca: env("SIGWATCH_API_CA"), cert: env("SIGWATCH_API_CERT"), key: env("SIGWATCH_API_KEY")}}
	if _, err := hc.httpClient(); err != nil {
		return err
	}
	resp, err := hc.hc.Do(req)
	var op *net.OpError
	switch {
	case err == nil:
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("no answer from %s within %v", url, within)
	case errors.As(err, &op) && op.Op == "dial":
		return fmt.Errorf("nothing answers at %s: is sigwatch running?", url)
	case hc.tlsError(err) != "":
		return errors.New(hc.tlsError(err))
	default:
		return fmt.Errorf("%s: %v", url, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		var r struct {
			Problems []string `json:"problems"`
		}
		if json.Unmarshal(b, &r) == nil && len(r.Problems) > 0 {
			return fmt.Errorf("not ready: %s", strings.Join(r.Problems, "; "))
		}
		return fmt.Errorf("%s answered %s", url, resp.Status)
	}
	_, _ = stdout.Write(b)
	return nil
}

// httpSummary says where the API listens, how and who may call it: the
// tokens' names and roles, never the tokens.
func httpSummary(c api.Config) string {
	scheme := "http"
	if c.TLS.CertFile != "" {
		scheme = "https"
		if c.TLS.ClientCAFile != "" {
			scheme += " with client certificates"
		}
	}
	out := fmt.Sprintf("listens on %s (%s)", c.Addr, scheme)
	var each []string
	if c.Token != "" {
		each = append(each, "http.token (admin)")
	}
	for _, t := range c.Tokens {
		each = append(each, fmt.Sprintf("%s (%s)", t.Name, t.Role))
	}
	if len(each) == 0 {
		return out + "; no token: whoever reaches it may do everything"
	}
	out += "; tokens: " + strings.Join(each, ", ")
	if c.MetricsAuth == "token" {
		out += "; /metrics needs a token"
	}
	return out
}
