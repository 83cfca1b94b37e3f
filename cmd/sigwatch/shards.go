package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/sigwatch/sigwatch/shard"
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
	v, err := shardsStatus(ctx, store, now)
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
	t, err := store.Double(ctx, now)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "doubling %d -> %d shards started (epoch %d).\n"+
		"Nothing is copied: every role switches within a second, and the old shards drain as their\n"+
		"moved devices fall due (about one threshold). Watch it with `sigwatch shards status`.\n",
		t.Prev, t.Shards, t.Epoch)
	if note := doubleTimers(ctx, store, t, now); note != "" {
		fmt.Fprintln(stdout, note)
	}
	return nil
}

// doubleTimers doubles the alarm's repeat timer queue along with the
// deadlines (now at t), so both keep one shard count, and says what it did
// ("" when the alarm role never ran). A doubling of the timers drains as
// their moved timers fire (up to the longest repeat interval or ack); while
// it does, the next doubling of the deadlines leaves the timers behind,
// which costs nothing but balance: each queue has its own topology.
func doubleTimers(ctx context.Context, store *shard.Store, t shard.Topology, now time.Time) string {
	timers := store.Sub("alarm")
	rt, err := timers.Topology(ctx)
	switch {
	case err != nil:
		return "" // no alarm role yet: its timers start with the deadlines' count
	case rt.Shards >= t.Shards:
		return ""
	}
	nt, err := timers.Double(ctx, now)
	switch {
	case errors.Is(err, shard.ErrDraining):
		return fmt.Sprintf("alarm repeat timers: their previous doubling still drains; they stay at %d shards until a later doubling", rt.Shards)
	case err != nil:
		return "alarm repeat timers not doubled: " + err.Error()
	}
	return fmt.Sprintf("alarm repeat timers: doubling %d -> %d shards started (epoch %d).", nt.Prev, nt.Shards, nt.Epoch)
}

// postShardsDouble is POST /v1/shards/double: 200 with the new topology, 409
// while a previous doubling drains.
func (a *App) postShardsDouble(w http.ResponseWriter, r *http.Request) {
	now := a.clock.Now()
	t, err := a.store.Double(r.Context(), now)
	if err != nil {
		writeErr(w, err)
		return
	}
	if note := doubleTimers(r.Context(), a.store, t, now); note != "" {
		a.log.Info(note)
	}
	writeJSON(w, http.StatusOK, t)
}

// drainView is the progress of the doubling in force, for GET /v1/shards
// and sigwatch shards status.
type drainView struct {
	Draining bool  `json:"draining"`
	From     int   `json:"from,omitempty"`
	To       int   `json:"to,omitempty"`
	SinceMS  int64 `json:"since,omitempty"`
	// MovedLeft is the sum of the last counts of moved devices (timers of
	// every family) the old shards hold; counted every few seconds by each
	// old shard's owner.
	MovedLeft int64 `json:"moved_left"`
	// ShardsDrained of the From old shards are checked clean behind their
	// floor; ShardsUnchecked have not been checked for this doubling yet.
	ShardsDrained   int          `json:"shards_drained"`
	ShardsUnchecked int          `json:"shards_unchecked"`
	Writers         []writerView `json:"writers"`
}

// writerView is one ingest writer and the epoch it writes with.
type writerView struct {
	Name    string `json:"name"`
	Epoch   int64  `json:"epoch"`
	AgeMS   int64  `json:"age_ms"`
	Current bool   `json:"current"` // writes with the current topology
	Gone    bool   `json:"gone"`    // silent for longer than shard.WriterTimeout
}

// drainStatus reads the progress of the doubling in force. Writers are
// listed whether or not a doubling drains.
func drainStatus(ctx context.Context, store *shard.Store, t shard.Topology, now time.Time) (drainView, error) {
	ws, err := store.Writers(ctx)
	if err != nil {
		return drainView{}, err
	}
	v := drainView{Writers: []writerView{}}
	for name, r := range ws {
		age := now.UnixMilli() - r.At
		v.Writers = append(v.Writers, writerView{Name: name, Epoch: r.Epoch, AgeMS: age,
			Current: r.Epoch >= t.Epoch, Gone: age > shard.WriterTimeout.Milliseconds()})
	}
	slices.SortFunc(v.Writers, func(a, b writerView) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	if !t.Draining() {
		return v, nil
	}
	reports, err := store.DrainReports(ctx)
	if err != nil {
		return drainView{}, err
	}
	v.Draining, v.From, v.To, v.SinceMS = true, t.Prev, t.Shards, t.Since
	for i := range t.Prev {
		r, ok := reports[i]
		switch {
		case !ok || r.Epoch != t.Epoch:
			v.ShardsUnchecked++
		case r.Drained(t.Epoch):
			v.ShardsDrained++
		default:
			v.MovedLeft += r.Moved
		}
	}
	return v, nil
}

// printDrain writes the human form of v for sigwatch shards status.
func printDrain(w io.Writer, v drainView, now time.Time) {
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

// shardView is one shard in GET /v1/shards.
type shardView struct {
	Shard        int    `json:"shard"`
	Size         int64  `json:"size"`
	HeadDeadline int64  `json:"head_deadline,omitempty"`
	HeadLagMS    int64  `json:"head_lag_ms"`
	Owner        string `json:"owner"`
	// Timers and TimersOwner are the shard's generic timers and the
	// holder of their lease.
	Timers      int64  `json:"timers"`
	TimersOwner string `json:"timers_owner"`
}

// shardsView is GET /v1/shards.
type shardsView struct {
	shard.Topology
	Watermark    int64     `json:"watermark"`
	WatermarkLag int64     `json:"watermark_lag_ms"`
	Drain        drainView `json:"drain"`
	Devices      int64     `json:"devices"`
	// GenericTimers counts the generic timers in the same shards.
	GenericTimers int64       `json:"timers"`
	List          []shardView `json:"list"`
	// Timers is the topology of the alarm's repeat timers (absent before
	// the alarm role first ran), with the number of timers.
	Timers *timersView `json:"alarm_timers,omitempty"`
}

// timersView is the alarm's repeat timer queue in GET /v1/shards.
type timersView struct {
	shard.Topology
	Size int64 `json:"size"`
}

func shardsStatus(ctx context.Context, store *shard.Store, now time.Time) (shardsView, error) {
	t, err := store.Topology(ctx)
	if err != nil {
		return shardsView{}, err
	}
	wm, _, err := store.Watermarks().Read(ctx)
	if err != nil {
		return shardsView{}, err
	}
	v := shardsView{Topology: t, Watermark: wm}
	if wm > 0 {
		v.WatermarkLag = now.UnixMilli() - wm
	}
	if v.Drain, err = drainStatus(ctx, store, t, now); err != nil {
		return v, err
	}
	timers := store.Sub("alarm")
	if rt, err := timers.Topology(ctx); err == nil {
		v.Timers = &timersView{Topology: rt}
		sts, err := timers.Status(ctx, shard.Repeats, rt.Shards)
		if err != nil {
			return v, err
		}
		for _, st := range sts {
			v.Timers.Size += st.Size
		}
	}
	sts, err := store.Status(ctx, shard.Deadlines, t.Shards)
	if err != nil {
		return v, err
	}
	tsts, err := store.Leases("timers").Status(ctx, shard.Timers, t.Shards)
	if err != nil {
		return v, err
	}
	for j, st := range sts {
		sv := shardView{Shard: st.Shard, Size: st.Size, Owner: st.Owner, Timers: tsts[j].Size, TimersOwner: tsts[j].Owner}
		v.GenericTimers += tsts[j].Size
		if st.HasHead {
			sv.HeadDeadline = st.Head.Deadline
			if lag := now.UnixMilli() - st.Head.Deadline; lag > 0 {
				sv.HeadLagMS = lag
			}
		}
		v.Devices += sv.Size
		v.List = append(v.List, sv)
	}
	return v, nil
}

func (a *App) getShards(w http.ResponseWriter, r *http.Request) {
	v, err := shardsStatus(r.Context(), a.store, a.clock.Now())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}
