// Command sigwatch-bench runs sigwatch's benchmark harness: it starts its own
// Redis, Mosquitto and nats-server on loopback, measures every scenario side
// by side with its baseline, and writes bench/RESULTS.md and
// bench/results.json. bench is its own module; run it from bench/:
//
//	go run ./cmd/sigwatch-bench -profile quick   # make bench, < 5 min
//	go run ./cmd/sigwatch-bench -profile full
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sigwatch/sigwatch/bench"
)

func main() {
	// The harness starts this binary again for its load generator and its
	// nats-server, so that its own CPU time is sigwatch's alone.
	if role := os.Getenv(bench.ChildEnv); role != "" {
		os.Exit(bench.RunChild(role))
	}
	os.Exit(run())
}

func run() int {
	var (
		opts bench.Options
		only string
	)
	flag.StringVar(&opts.Profile, "profile", "quick", "quick (make bench, about 15 minutes on 2 cores) or full (about an hour)")
	flag.StringVar(&opts.OutDir, "out", ".", "directory for RESULTS.md, results.json and profiles/")
	flag.StringVar(&only, "only", "", "comma-separated scenarios to run (write, memory, firelag, burst, peers, ingest, overload, doubling, timers, idle, checkpoint); "+
		"a partial run writes results.json only")
	flag.BoolVar(&opts.Merge, "merge", false, "with -only: replace those scenarios in results-<profile>.json and render RESULTS.md again")
	flag.BoolVar(&opts.KeepDir, "keep", false, "keep the servers' working directory (logs, data) after the run")
	flag.BoolVar(&opts.RenderOnly, "render", false, "measure nothing; render RESULTS.md again from results-<profile>.json and ANALYSIS.md")
	flag.Parse()
	if only != "" {
		opts.Only = strings.Split(only, ",")
	}
	opts.Command = "sigwatch-bench " + strings.Join(os.Args[1:], " ")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench.Run(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "sigwatch-bench:", err)
		return 1
	}
	return 0
}
