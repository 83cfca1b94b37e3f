// Package bench is sigwatch's benchmark harness. It starts its own Redis,
// Mosquitto and nats-server (with JetStream and the MQTT listener) on
// loopback random ports, runs each scenario side by side with the baseline it
// is judged against, in the same run on the same machine, and writes
// bench/RESULTS.md and bench/results.json. Every figure in RESULTS.md is a
// ratio against a baseline measured minutes earlier: these machines are
// shared and noisy, and absolute numbers drift.
//
// The load generator and nats-server run in child processes (the bench
// binary started again, see child.go), so that the CPU time of this process
// is sigwatch's own (ingest, scanner, the Redis writer) and can be reported
// per signal.
//
// Goroutines: Run owns every goroutine it starts, through the scenario that
// started it; each scenario stops what it started before it returns, senders
// (load generators) before receivers (ingest, scanner, subscribers).
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Options configure a run.
type Options struct {
	Profile string   // "quick" (make bench, < 5 min on 2 cores) or "full"
	OutDir  string   // where RESULTS.md, results*.json and profiles/ go; default "." (bench/)
	Only    []string // scenario names to run (ingest, write, firelag, burst, memory, peers, overload, doubling, timers, idle); empty: all
	// Command is the command line recorded in the results.
	Command  string
	Progress io.Writer // default os.Stderr
	// KeepDir keeps the servers' working directory (logs, data) after the run.
	KeepDir bool
	// Merge makes a partial run (Only) replace its scenarios in
	// results-<profile>.json and render RESULTS.md again; each merged
	// scenario says which run measured it.
	Merge bool
	// RenderOnly measures nothing: it renders RESULTS.md again from the
	// results-<profile>.json files and ANALYSIS.md in OutDir.
	RenderOnly bool
}

// profile sizes a run.
type profile struct {
	Name string
	// IngestDevices publish over MQTT in scenario 1; RampStart and
	// RampFactor shape the paced ramp; Step is how long each rate is held;
	// Bisect is how many refinement steps follow the first failed rate.
	IngestDevices int
	RampStart     float64
	RampFactor    float64
	Step          time.Duration
	Bisect        int
	// DrainIdle is how long the end of a ramp waits with nothing more
	// delivered before what is missing counts as lost; the full profile
	// waits past nats-server's 30s MQTT redelivery.
	DrainIdle time.Duration
	// WriteDevices is the key space of the Redis write path; WriteFor is the
	// length of each write-path measurement.
	WriteDevices int
	WriteFor     time.Duration
	// MemoryDevices are the fleet sizes of the memory scenario; the durable
	// registry is measured at the first.
	MemoryDevices []int
	// LagDevices are the fleet sizes of the fire-lag scenario; LagWindow is
	// the time over which the expiring devices fall due, LagFires how many
	// fall due in it.
	LagDevices []int
	LagWindow  time.Duration
	LagFires   int
	// Burst is the number of deadlines that fall due at once.
	Burst int
	// PeerDevices is the number of timers in the peers comparison;
	// PeerFor the length of each peer's measurement.
	PeerDevices int
	PeerFor     time.Duration
	// TimerCounts are the timer counts of the timers scenario.
	TimerCounts []int
	// DoublingDevices is the key space of the doubling scenario; its
	// writers push deadlines DoublingThreshold ahead (a drain lasts about
	// that long), and each phase is measured for DoublingPhase.
	DoublingDevices   int
	DoublingThreshold time.Duration
	DoublingPhase     time.Duration
	// OverloadDevices signal once every OverloadEvery (the nominal rate);
	// the surge doubles it for OverloadSurge after OverloadBefore, then the
	// nominal rate holds for OverloadAfter. OverloadVictims devices stay
	// silent and fall due over the three phases.
	OverloadDevices int
	OverloadEvery   time.Duration
	OverloadBefore  time.Duration
	OverloadSurge   time.Duration
	OverloadAfter   time.Duration
	OverloadVictims int
	// IdleWindow is how long each round of the idle scenario is measured.
	IdleWindow time.Duration
	// CheckpointDevices is the fleet of the checkpoint scenario.
	CheckpointDevices int
}

var profiles = map[string]profile{
	"quick": {
		Name:          "quick",
		IngestDevices: 20_000, RampStart: 10_000, RampFactor: 1.4, Step: 1500 * time.Millisecond, Bisect: 2, DrainIdle: 5 * time.Second,
		WriteDevices: 100_000, WriteFor: 3 * time.Second, MemoryDevices: []int{100_000},
		LagDevices: []int{100_000}, LagWindow: 8 * time.Second, LagFires: 8_000,
		Burst:       100_000,
		PeerDevices: 50_000, PeerFor: 3 * time.Second, TimerCounts: []int{100_000},
		DoublingDevices: 100_000, DoublingThreshold: 10 * time.Second, DoublingPhase: 3 * time.Second,
		OverloadDevices: 20_000, OverloadEvery: 2 * time.Second, OverloadBefore: 5 * time.Second, OverloadSurge: 10 * time.Second,
		OverloadAfter: 15 * time.Second, OverloadVictims: 3_000,
		IdleWindow:        5 * time.Second,
		CheckpointDevices: 100_000,
	},
	"full": {
		Name:          "full",
		IngestDevices: 100_000, RampStart: 10_000, RampFactor: 1.3, Step: 3 * time.Second, Bisect: 3, DrainIdle: 35 * time.Second,
		WriteDevices: 1_000_000, WriteFor: 8 * time.Second, MemoryDevices: []int{1_000_000, 10_000_000},
		LagDevices: []int{100_000, 1_000_000, 10_000_000}, LagWindow: 20 * time.Second, LagFires: 20_000,
		Burst:       100_000,
		PeerDevices: 100_000, PeerFor: 8 * time.Second, TimerCounts: []int{100_000, 1_000_000},
		DoublingDevices: 1_000_000, DoublingThreshold: time.Minute, DoublingPhase: 8 * time.Second,
		OverloadDevices: 20_000, OverloadEvery: 2 * time.Second, OverloadBefore: 10 * time.Second, OverloadSurge: 10 * time.Second,
		OverloadAfter: 30 * time.Second, OverloadVictims: 5_000,
		IdleWindow:        10 * time.Second,
		CheckpointDevices: 10_000_000,
	},
}

// scenarioNames lists the scenarios in the order they run.
var scenarioNames = []string{"write", "memory", "firelag", "burst", "peers", "ingest", "overload", "doubling", "timers", "idle", "checkpoint", "timerjournal"}

// Run runs the benchmark and writes its results into opts.OutDir.
func Run(ctx context.Context, opts Options) error {
	prof, ok := profiles[opts.Profile]
	if !ok {
		return fmt.Errorf("bench: unknown profile %q: use quick or full", opts.Profile)
	}
	if opts.OutDir == "" {
		opts.OutDir = "."
	}
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	for _, s := range opts.Only {
		if !contains(scenarioNames, s) {
			return fmt.Errorf("bench: unknown scenario %q: use one of %s", s, strings.Join(scenarioNames, ", "))
		}
	}
	if st, err := os.Stat(opts.OutDir); err != nil || !st.IsDir() {
		return fmt.Errorf("bench: output directory %q not found: run from bench/ or pass -out", opts.OutDir)
	}
	if opts.RenderOnly {
		return render(opts.OutDir)
	}
	p := newProgress(opts.Progress)
	started := time.Now()
	load := loadAverage()

	dir, err := os.MkdirTemp("", "sigwatch-bench-")
	if err != nil {
		return fmt.Errorf("bench: work dir: %w", err)
	}
	if opts.KeepDir {
		p.Printf("setup", "servers' directory kept: %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	p.Printf("setup", "profile %s: starting Redis, Mosquitto and nats-server (JetStream, MQTT) on loopback", prof.Name)
	e, err := startEnv(ctx, dir, p)
	if err != nil {
		return err
	}
	defer e.close()

	res := &Results{
		Profile: prof.Name,
		Command: opts.Command,
		Started: started.UTC().Format(time.RFC3339),
		Commit:  gitCommit(),
		Machine: machineInfo(e),
	}
	res.Machine.LoadAtStart = load
	want := func(name string) bool { return len(opts.Only) == 0 || contains(opts.Only, name) }
	r := &runner{e: e, prof: prof, p: p, res: res, profDir: filepath.Join(opts.OutDir, "profiles")}
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"write", r.writePath},
		{"memory", r.memory},
		{"firelag", r.fireLag},
		{"burst", r.burst},
		{"peers", r.peers},
		{"ingest", r.ingest},
		{"overload", r.overload},
		{"doubling", r.doubling},
		{"timers", r.timers},
		{"idle", r.idle},
		{"checkpoint", r.checkpoint},
		{"timerjournal", r.timerJournal},
	}
	var errs []error
	for _, s := range steps {
		if !want(s.name) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		t := time.Now()
		p.Printf(s.name, "start")
		if err := s.run(ctx); err != nil {
			p.Printf(s.name, "FAILED: %v", err)
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
			res.Failures = append(res.Failures, fmt.Sprintf("%s: %v", s.name, err))
		}
		p.Printf(s.name, "done in %s", time.Since(t).Round(100*time.Millisecond))
	}
	for i := range res.Profiles {
		pr := &res.Profiles[i]
		top, err := pprofTop(filepath.FromSlash(pr.File), 20)
		if err != nil {
			top = []string{"(go tool pprof failed: " + err.Error() + ")"}
		}
		pr.Top = top
	}
	res.Duration = time.Since(started).Round(time.Second).String()
	res.sortScenarios()
	fmt.Fprintln(opts.Progress, "\n"+res.summary())
	if err := res.write(opts.OutDir, len(opts.Only) == 0); err != nil {
		errs = append(errs, err)
	}
	if len(opts.Only) > 0 && opts.Merge && len(res.Failures) == 0 {
		if err := res.merge(opts.OutDir); err != nil {
			errs = append(errs, err)
		} else {
			p.Printf("report", "merged %s into %s and rendered %s", strings.Join(opts.Only, ", "),
				filepath.Join(opts.OutDir, "results-"+prof.Name+".json"), filepath.Join(opts.OutDir, "RESULTS.md"))
		}
	}
	if len(opts.Only) == 0 {
		p.Printf("report", "wrote %s and %s in %s", filepath.Join(opts.OutDir, "RESULTS.md"),
			filepath.Join(opts.OutDir, "results.json"), res.Duration)
	} else {
		p.Printf("report", "partial run: wrote %s only, in %s", filepath.Join(opts.OutDir, "results.json"), res.Duration)
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// runner carries what every scenario needs.
type runner struct {
	e       *env
	prof    profile
	p       *progress
	res     *Results
	profDir string

	// ceiling is the raw Redis ZADD ceiling (members/s) measured by the
	// write-path scenario; the fire-lag scenario resets at half of it.
	ceiling float64
	// burstCPU is who was busy while the scanner fired the burst.
	burstCPU cpuShares
	// r3, while set, is the NATS cluster the burst's sides publish to, in
	// place of the run's single server (see withR3).
	r3 *natsR3
}

// progress prints timestamped lines while the run goes on.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func newProgress(w io.Writer) *progress { return &progress{w: w, start: time.Now()} }

// Printf prints one progress line for scenario what.
func (p *progress) Printf(what, format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "[%6.1fs] %-9s %s\n", time.Since(p.start).Seconds(), what, fmt.Sprintf(format, args...))
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
