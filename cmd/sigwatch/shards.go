package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/stats"
)

// cmdShards shows the topology, drain progress and every shard:
// sigwatch shards status [--api URL] [--json], or with --config on the
// config's Redis directly, for when no API answers.
func cmdShards(ctx context.Context, args []string, stdout io.Writer) error {
	const use = "usage: sigwatch shards status [--api URL | --config file] [--json] | sigwatch shards double [--api URL | --config file] [--json]"
	if len(args) == 0 || args[0] != "status" {
		return errors.New(use)
	}
	fs := flag.NewFlagSet("shards status", flag.ContinueOnError)
	c := apiFlags(fs)
	path := fs.String("config", "", "read the shards on this config's Redis directly instead of through the API")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New(use)
	}
	ctx, cancel := context.WithTimeout(ctx, *c.timeout)
	defer cancel()
	var v api.Shards
	now := time.Now()
	if *path != "" {
		// Lags are measured on Redis server time, the clock the roles run on.
		store, rnow, err := dialConfigured(ctx, *path)
		if err != nil {
			return err
		}
		defer store.Close()
		if v, err = api.ShardsStatus(ctx, store, rnow); err != nil {
			return err
		}
		now = rnow
	} else if err := c.getJSON(ctx, "/v1/shards", &v); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, v)
	}
	fmt.Fprintf(stdout, "shards %d  prev %d  epoch %d  devices %d  timers %d  watermark lag %s\n\n",
		v.Shards, v.Prev, v.Epoch, v.Devices, v.GenericTimers, msAgo(v.WatermarkLag))
	printDrain(stdout, v.Drain, now)
	if rt := v.Timers; rt != nil {
		fmt.Fprintf(stdout, "alarm repeat timers: shards %d  prev %d  epoch %d  timers %d\n\n", rt.Shards, rt.Prev, rt.Epoch, rt.Size)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tSIZE\tHEAD LAG\tOWNER\tTIMERS\tTIMERS OWNER")
	for _, s := range v.List {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%s\n", s.Shard, s.Size, msAgo(s.HeadLagMS), orDash(s.Owner), s.Timers, orDash(s.TimersOwner))
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

// cmdShardsDouble starts a doubling of the shard count:
// sigwatch shards double [--api URL | --config file] [--json].
func cmdShardsDouble(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("shards double", flag.ContinueOnError)
	c := apiFlags(fs)
	path := fs.String("config", "", "double on this config's Redis directly instead of through the API")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *c.timeout)
	defer cancel()
	var d api.Doubling
	if *path != "" {
		// The drain compares the doubling's start with its own clock: it is
		// stamped on Redis server time, the clock the roles run on.
		store, now, err := dialConfigured(ctx, *path)
		if err != nil {
			return err
		}
		defer store.Close()
		if d.Topology, d.Note, err = api.Double(ctx, store, now); err != nil {
			return err
		}
	} else if err := c.callJSON(ctx, http.MethodPost, "/v1/shards/double", nil, &d); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, d)
	}
	fmt.Fprintf(stdout, "doubling %d -> %d shards started (epoch %d).\n"+
		"Nothing is copied: every role switches within a second, and the old shards drain as their\n"+
		"moved devices fall due (about one threshold). Watch it with `sigwatch shards status`.\n",
		d.Prev, d.Shards, d.Epoch)
	if d.Note != "" {
		fmt.Fprintln(stdout, d.Note)
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
		fmt.Fprintf(w, "writer %s: epoch %d, reported %s ago, %s\n", wr.Name, wr.Epoch, msAgo(wr.AgeMS), state)
	}
}
