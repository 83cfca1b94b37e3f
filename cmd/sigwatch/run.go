package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/guard"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/clock"
	"github.com/sigwatch/sigwatch/internal/liveness"
	"github.com/sigwatch/sigwatch/internal/ratelog"
	"github.com/sigwatch/sigwatch/scanner"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/sinks"
	"github.com/sigwatch/sigwatch/stats"
	"github.com/sigwatch/sigwatch/timer"
)

// App is one running sigwatch process: the roles it was given, wired to
// Redis, NATS and the broker.
type App struct {
	cfg Config
	// id is this process's one name wherever it is shown: its stats
	// report, its leases (shard owners), its writer report and its log.
	id  string
	log *slog.Logger
	reg *prometheus.Registry
	// store is the process's Redis connection; scanStore is the scanner
	// role's own (nil without the role): its claims, registry reads and
	// settles are small and latency-bound, and on the shared connection
	// they would queue behind ingest's large pipelined batches.
	store     *shard.Store
	scanStore *shard.Store
	// clock is the one time base every role and handler decides on.
	clock *clock.Clock
	topo  *shard.Watcher
	thr   *shard.Thresholds
	// guard detects Redis losing data and restores it from registry, the
	// durable device registry (nil in NATS core mode).
	guard    *guard.Guard
	registry *dispatch.Registry
	journal  *dispatch.TimerJournal // the durable timers' journal (nil: none)
	devices  *shard.Devices         // the API's per-device operations
	pub      *dispatch.Bus
	in       *ingest.Ingest
	claim    *ingest.Claim // this process's hold on its mqtt.client_id
	// advisories follows the NATS MQTT listener's client advisories into
	// in (nil: nats.advisories off, or no ingest role).
	advisories *dispatch.Advisories
	sc         *scanner.Scanner

	// repeats and repeatTopo are the store of the alarm's repeats (a timer
	// family of its own) and its topology; alarms serves the alarm role and
	// the API's ack and mutes (nil when NATS runs in core mode).
	repeats    *shard.Store
	repeatTopo *shard.Watcher
	alarms     *alarm.Alarms
	sinks      *sinks.Sinks // nil: none configured

	// timerSvc is the generic timers: their API, NATS path and firing (nil
	// when timers.enabled is off).
	timerSvc *timer.Service

	// stats reports this process's counts; GET /v1/stats reads them.
	stats *stats.Fleet

	// api serves httpLn (both nil without the api role).
	api    *api.API
	httpLn net.Listener
	live   *liveness.Liveness // what /healthz answers
	// deps knows whether Redis or NATS is down: the API answers 503 at
	// once then, and the log groups the outage's warnings.
	deps *liveness.Deps

	// g runs the roles, the HTTP server and the watchers; done is closed
	// once they stopped and the clients are closed, err is then the first
	// fatal error.
	g    *group
	done chan struct{}
	err  error
}

// processID names this process uniquely, host-pid-random: leases and
// membership use it, so a restarted process never passes for its previous
// life, and the pid lets an operator find it on its host.
func processID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Start connects to everything the configured roles need and starts them.
// The returned App runs until ctx is done or Stop is called.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Every warning and error goes out at most once per message and
	// period, and once per period for a whole outage of Redis or NATS.
	var deps *liveness.Deps
	log = slog.New(ratelog.NewHandler(log.Handler(), ratelog.Every, nil, func() string { return deps.First() }))
	deps = liveness.NewDeps(log.With("role", "deps"))
	for _, w := range cfg.Warnings() {
		log.Warn("config: " + w)
	}
	a := &App{cfg: cfg, id: processID(), log: log, reg: prometheus.NewRegistry(), g: newGroup(), done: make(chan struct{}), deps: deps}
	// A coordinator without progress for three lease times has lost its
	// shards: stuck (liveness.New keeps at least 15s).
	a.live = liveness.New(3 * cfg.Scanner.LeaseTTL)
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ok := false
	defer func() {
		if !ok {
			if a.claim != nil {
				a.claim.Release()
			}
			a.closeClients()
		}
	}()
	// Each step needs the ones before: connections, then Redis's data
	// vetted, then the roles on top of it.
	for _, step := range []func(context.Context) error{a.connect, a.establish, a.newIngest, a.newAdvisories, a.newScanner, a.newAlarms, a.newTimers, a.newAPI} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	ok = true
	a.run(ctx)
	offset, uncertainty := a.clock.Offset()
	mqttID := ""
	if cfg.hasRole("ingest") {
		mqttID = cfg.MQTT.ClientID
	}
	log.Info("sigwatch started", "process", a.id, "mqtt_client_id", mqttID, "roles", strings.Join(cfg.Roles, ","), "shards", a.topo.Current().Shards,
		"epoch", a.topo.Current().Epoch, "http", a.HTTPAddr(), "clock_offset", offset.String(), "clock_uncertainty", uncertainty.String())
	return a, nil
}

// run starts the group, in start order (it stops them in reverse), and
// the goroutine that shuts it down when ctx ends or a member fails.
func (a *App) run(ctx context.Context) {
	a.g.Go("clock", func(ctx context.Context) error { a.clock.Run(ctx); return nil })
	a.g.Go("deps", a.deps.Run)
	a.g.Go("topology", func(ctx context.Context) error { a.topo.Run(ctx); return nil })
	a.guard.Watch(a.topo, a.repeatTopo)
	a.g.Go("guard", a.guard.Run)
	if a.registry != nil {
		a.g.Go("registry", a.registry.Run)
	}
	a.g.Go("thresholds", func(ctx context.Context) error { a.thr.Run(ctx, time.Second, a.log); return nil })
	if a.repeatTopo != nil {
		a.g.Go("alarm topology", func(ctx context.Context) error { a.repeatTopo.Run(ctx); return nil })
	}
	if a.api != nil {
		// SIGHUP reads the tokens and http.tls's files again.
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		a.g.Go("http", func(ctx context.Context) error {
			defer signal.Stop(hup)
			return a.api.Serve(ctx, a.httpLn, hup)
		})
	}
	if a.sinks != nil && a.cfg.hasRole("alarm") {
		a.g.Go("sinks", a.sinks.Run)
	}
	if a.alarms != nil && a.cfg.hasRole("alarm") {
		a.g.Go("alarm", a.alarms.Run)
	}
	if a.sc != nil {
		a.g.Go("scanner", a.sc.Run)
	}
	if a.claim != nil {
		a.g.Go("mqtt claim", a.claim.Run) // released after ingest stopped
	}
	if a.in != nil {
		a.g.Go("ingest", a.in.Run)
	}
	if a.advisories != nil {
		a.g.Go("nats advisories", a.runAdvisories) // stopped before ingest
	}
	if a.timerSvc != nil {
		a.g.Go("timers", a.timerSvc.Run)
	}
	a.g.Go("stats", a.stats.Run)
	go func() {
		select {
		case <-ctx.Done():
		case <-a.g.stopping:
		}
		a.err = a.g.Shutdown()
		if a.err != nil {
			a.log.Error("fatal", "err", a.err)
		}
		a.closeClients()
		a.log.Info("sigwatch stopped")
		close(a.done)
	}()
}

func (a *App) closeClients() {
	if a.advisories != nil {
		a.advisories.Close()
	}
	if a.pub != nil {
		a.pub.Close()
	}
	if a.scanStore != nil {
		a.scanStore.Close()
	}
	if a.store != nil {
		a.store.Close()
	}
}

// Stop shuts the process down and waits.
func (a *App) Stop() error {
	a.g.Stop()
	return a.Wait()
}

// Wait blocks until the process has stopped and returns the fatal error, if any.
func (a *App) Wait() error {
	<-a.done
	return a.err
}

// testClockSkew reads SIGWATCH_TEST_CLOCK_SKEW, a Go duration added to this
// process's local clock. It is a test seam only: it lets the process tests
// run hosts whose clocks disagree. It is not configuration and not
// documented as such.
func testClockSkew() (time.Duration, error) {
	v := os.Getenv("SIGWATCH_TEST_CLOCK_SKEW")
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("SIGWATCH_TEST_CLOCK_SKEW: %w", err)
	}
	return d, nil
}

// ID is this process's id, as its stats report and shard leases show it.
func (a *App) ID() string { return a.id }

// HTTPAddr is the address the API listens on ("" without the api role).
func (a *App) HTTPAddr() string {
	if a.httpLn == nil {
		return ""
	}
	return a.httpLn.Addr().String()
}
