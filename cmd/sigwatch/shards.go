package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/stats"
)

// cmdShards shows the topology, drain progress and every shard:
// sigwatch shards status [--config file] [--json].
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
	// Lags are measured on Redis server time, the clock the roles run on.
	store, now, err := dialConfigured(ctx, *path)
	if err != nil {
		return err
	}
	defer store.Close()
	v, err := api.ShardsStatus(ctx, store, now)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	fmt.Fprintf(stdout, "shards %d  prev %d  epoch %d  devices %d  timers %d  watermark lag %dms\n\n",
		v.Shards, v.Prev, v.Epoch, v.Devices, v.GenericTimers, v.WatermarkLag)
	printDrain(stdout, v.Drain, now)
	if rt := v.Timers; rt != nil {
		fmt.Fprintf(stdout, "alarm repeat timers: shards %d  prev %d  epoch %d  timers %d\n\n", rt.Shards, rt.Prev, rt.Epoch, rt.Size)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tSIZE\tHEAD LAG\tOWNER\tTIMERS\tTIMERS OWNER")
	for _, s := range v.List {
		fmt.Fprintf(tw, "%d\t%d\t%dms\t%s\t%d\t%s\n", s.Shard, s.Size, s.HeadLagMS, s.Owner, s.Timers, s.TimersOwner)
	}
	return tw.Flush()
}

// dialConfigured loads the config at path (with the environment over it),
// dials its Redis and reads its server time, the clock the roles run on.
func dialConfigured(ctx context.Context, path string) (*shard.Store, time.Time, error) {
	cfg, err := LoadConfig(path, os.Environ())
	if err != nil {
		return nil, time.Time{}, err
	}
	store, err := shard.Dial(cfg.Redis)
	if err != nil {
		return nil, time.Time{}, err
	}
	now, err := store.Time(ctx)
	if err != nil {
		store.Close()
		return nil, time.Time{}, err
	}
	return store, now, nil
}

// cmdShardsDouble starts a doubling of the shard count on the Redis of the
// config: sigwatch shards double [--config file].
func cmdShardsDouble(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("shards double", flag.ContinueOnError)
	path := fs.String("config", os.Getenv("SIGWATCH_CONFIG"), "YAML config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The drain compares the doubling's start with its own clock: it is
	// stamped on Redis server time, the clock the roles run on.
	store, now, err := dialConfigured(ctx, *path)
	if err != nil {
		return err
	}
	defer store.Close()
	t, note, err := api.Double(ctx, store, now)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "doubling %d -> %d shards started (epoch %d).\n"+
		"Nothing is copied: every role switches within a second, and the old shards drain as their\n"+
		"moved devices fall due (about one threshold). Watch it with `sigwatch shards status`.\n",
		t.Prev, t.Shards, t.Epoch)
	if note != "" {
		fmt.Fprintln(stdout, note)
	}
	return nil
}

// printDrain writes the human form of v for sigwatch shards status.
func printDrain(w io.Writer, v stats.Drain, now time.Time) {
	if v.Draining {
		fmt.Fprintf(w, "doubling %d -> %d for %s: %d moved devices left; %d of %d old shards drained, %d not checked yet\n",
			v.From, v.To, now.Sub(time.UnixMilli(v.SinceMS)).Round(time.Second), v.MovedLeft,
			v.ShardsDrained, v.From, v.ShardsUnchecked)
	}
	for _, wr := range v.Writers {
		state := "current"
		switch {
		case wr.Gone:
			state = "gone"
		case !wr.Current:
			state = "LAGGING: the drain waits for it"
		}
		fmt.Fprintf(w, "writer %s: epoch %d, reported %dms ago, %s\n", wr.Name, wr.Epoch, wr.AgeMS, state)
	}
}
