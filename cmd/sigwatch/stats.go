package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/api"
)

// cmdStats shows the fleet's counters through the HTTP API:
// sigwatch stats [--api URL] [--json].
func cmdStats(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	c := apiFlags(fs)
	asJSON := fs.Bool("json", false, "print the JSON of GET /v1/stats")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("usage: sigwatch stats [--api URL] [--json]")
	}
	var v api.Stats
	return c.show(ctx, http.MethodGet, "/v1/stats", nil, &v, *asJSON, stdout, func() { printStats(stdout, v) })
}

// printStats writes the human form of v.
func printStats(w io.Writer, v api.Stats) {
	ms := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%.0fms", *p)
	}
	fmt.Fprintf(w, "watched %d  lost %d\n", v.Watched, v.Lost)
	if a := v.Alarms; a != nil {
		fmt.Fprintf(w, "alarms: active %d  held %d  acked %d  flapping %d  mutes %d\n", a.Active, a.Held, a.Acked, a.Flapping, a.Mutes)
	}
	fmt.Fprintf(w, "signals %.1f/s  lost %.1f/s\n", v.SignalsPerSec, v.LostPerSec)
	m := v.LastMinute
	fmt.Fprintf(w, "last minute: signals %d  lost %d  recovered %d  invalid %d\n", m.Signals, m.Lost, m.Recovered, m.Invalid)
	fmt.Fprintf(w, "fire lag (last minute, %d events): p50 %s  p99 %s\n", v.FireLag.Count, ms(v.FireLag.P50), ms(v.FireLag.P99))
	wm := v.Watermark
	switch {
	case wm.At == 0:
		fmt.Fprintln(w, "watermark: none (ingest never ran)")
	case wm.Outage:
		fmt.Fprintf(w, "watermark: %s old: OUTAGE in progress (nothing is declared lost for silence inside it)\n", msAgo(wm.AgeMS))
	default:
		fmt.Fprintf(w, "watermark: %s old\n", msAgo(wm.AgeMS))
	}
	if len(wm.BrokerDown) > 0 {
		fmt.Fprintf(w, "MQTT broker connection lost: %s\n", strings.Join(wm.BrokerDown, ", "))
	}
	if wm.GraceUntil > 0 {
		fmt.Fprintf(w, "reconnect grace after a broker restart until %s\n", msTime(wm.GraceUntil))
	}
	if len(wm.Outages) > 0 {
		fmt.Fprintf(w, "outages: %d recorded, the latest:", wm.OutagesTotal)
		for _, o := range wm.Outages {
			fmt.Fprintf(w, " %s (%s", msTime(o.Start), time.Duration(o.End-o.Start)*time.Millisecond)
			if o.GraceFrom > 0 {
				fmt.Fprintf(w, ", %s of it reconnect grace", time.Duration(o.End-o.GraceFrom)*time.Millisecond)
			}
			fmt.Fprint(w, ")")
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "shards %d  prev %d  epoch %d\n", v.Shards.Count, v.Shards.Prev, v.Shards.Epoch)
	if d := v.Shards.Drain; v.Shards.Draining {
		fmt.Fprintf(w, "doubling %d -> %d draining: %d moved devices left; %d of %d old shards drained, %d not checked yet\n",
			d.From, d.To, d.MovedLeft, d.ShardsDrained, d.From, d.ShardsUnchecked)
	}
	for _, p := range v.Processes {
		fmt.Fprintf(w, "process %s: %s, reported %s ago\n", p.Name, strings.Join(p.Roles, ","), msAgo(p.AgeMS))
	}
}
