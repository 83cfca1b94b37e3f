package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// cmdConfig is `sigwatch config check --config F`: load F with the
// environment's SIGWATCH_* overrides and validate it, as run would, without
// connecting to anything.
func cmdConfig(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		return errors.New("usage: sigwatch config check --config sigwatch.yaml")
	}
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", os.Getenv("SIGWATCH_CONFIG"), "YAML config file (env SIGWATCH_CONFIG)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cfg, err := LoadConfig(*path, os.Environ())
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	fmt.Fprintf(stdout, "%s: ok\n", *path)
	return nil
}

// cmdHealthcheck is `sigwatch healthcheck [URL]`: exit 0 when URL (default
// the local /readyz) answers 200. Container images without a shell or curl
// use it as their health check.
func cmdHealthcheck(ctx context.Context, args []string, stdout io.Writer) error {
	url := "http://127.0.0.1:8080/readyz"
	if len(args) > 0 {
		url = args[0]
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	_, _ = stdout.Write(b)
	return nil
}
