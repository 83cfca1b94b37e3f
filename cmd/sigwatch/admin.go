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
	"text/tabwriter"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/shard"
)

func cmdShards(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "status" {
		return fmt.Errorf("usage: sigwatch shards status [--config file] [--json] | sigwatch shards double [--config file]")
	}
	fs := flag.NewFlagSet("shards status", flag.ContinueOnError)
	path := fs.String("config", os.Getenv("SIGWATCH_CONFIG"), "YAML config file")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cfg, err := LoadConfig(*path, os.Environ())
	if err != nil {
		return err
	}
	tlsConf, err := cfg.Redis.TLS.Build()
	if err != nil {
		return err
	}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: cfg.Redis.Addrs, Username: cfg.Redis.Username,
		Password: cfg.Redis.Password, SelectDB: cfg.Redis.DB, TLSConfig: tlsConf, DisableCache: true})
	if err != nil {
		return fmt.Errorf("redis %v: %w", cfg.Redis.Addrs, err)
	}
	defer rc.Close()
	v, err := shardsStatus(ctx, shard.NewStore(rc, shard.NewKeys(cfg.Redis.Prefix)), time.Now())
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	fmt.Fprintf(stdout, "shards %d  prev %d  epoch %d  devices %d  watermark lag %dms\n\n",
		v.Shards, v.Prev, v.Epoch, v.Devices, v.WatermarkLag)
	printDrain(stdout, v.Drain, time.Now())
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tSIZE\tHEAD LAG\tOWNER")
	for _, s := range v.List {
		fmt.Fprintf(tw, "%d\t%d\t%dms\t%s\n", s.Shard, s.Size, s.HeadLagMS, s.Owner)
	}
	return tw.Flush()
}

// cmdDevice talks to a running sigwatch's HTTP API.
func cmdDevice(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("device", flag.ContinueOnError)
	api := fs.String("api", envOr("SIGWATCH_API", "http://127.0.0.1:8080"), "sigwatch API base URL (env SIGWATCH_API)")
	token := fs.String("token", os.Getenv("SIGWATCH_HTTP_TOKEN"), "API bearer token (env SIGWATCH_HTTP_TOKEN)")
	const use = "usage: sigwatch device [--api URL] get|rm <id> | threshold <id> <duration>"
	if len(args) < 2 {
		return errors.New(use)
	}
	verb, rest := args[0], args[1:]
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if fs.NArg() < 1 {
		return errors.New(use)
	}
	id := url.PathEscape(fs.Arg(0))
	var method, path string
	var body []byte
	switch verb {
	case "get":
		method, path = http.MethodGet, "/v1/devices/"+id
	case "rm":
		method, path = http.MethodDelete, "/v1/devices/"+id
	case "threshold":
		if fs.NArg() < 2 {
			return errors.New(use)
		}
		method, path = http.MethodPut, "/v1/devices/"+id+"/threshold"
		body, _ = json.Marshal(map[string]string{"threshold": fs.Arg(1)})
	default:
		return errors.New(use)
	}
	return callAPI(ctx, method, *api+path, *token, body, stdout)
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
