package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/guard"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/clock"
	"github.com/sigwatch/sigwatch/scanner"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/timer"
)

// App is one running sigwatch process: the roles it was given, wired to
// Redis, NATS and the broker.
type App struct {
	cfg Config
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
	devices  *shard.Devices // the API's per-device operations
	pub      *dispatch.Publisher
	in       *ingest.Ingest
	sc       *scanner.Scanner

	// timers and rtopo are the alarm's repeat timer queue and its
	// topology; alarms serves the alarm role and the API's ack and mutes
	// (nil when NATS runs in core mode).
	timers *shard.Store
	rtopo  *shard.Watcher
	alarms *alarm.Alarms

	// timers are the generic timers: their API, NATS path and firing (nil
	// when timers.enabled is off).
	timerSvc *timer.Service

	// stats reports this process's counts and serves GET /v1/stats.
	stats *fleetStats

	httpLn  net.Listener
	httpSrv *http.Server
	live    *liveness // what /healthz answers

	// g runs the roles, the HTTP server and the watchers; done is closed
	// once they stopped and the clients are closed, err is then the first
	// fatal error.
	g    *group
	done chan struct{}
	err  error
}

// replicaID names this process uniquely: leases and membership use it, so a
// restarted process never passes for its previous life.
func replicaID() string {
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
	for _, w := range cfg.Warnings() {
		log.Warn("config: " + w)
	}
	a := &App{cfg: cfg, log: log, reg: prometheus.NewRegistry(), g: newGroup(), done: make(chan struct{})}
	// A coordinator without progress for three lease times has lost its
	// shards: stuck (newLiveness keeps at least minStale, for a hung Redis).
	a.live = newLiveness(3 * cfg.Scanner.LeaseTTL)
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ok := false
	defer func() {
		if !ok {
			a.closeClients()
		}
	}()

	var err error
	if a.store, err = shard.Dial(cfg.Redis); err != nil {
		return nil, err
	}
	skew, err := testClockSkew()
	if err != nil {
		return nil, err
	}
	if a.clock, err = clock.New(a.store.Time, clock.Options{Skew: skew}, a.reg, log.With("role", "clock")); err != nil {
		return nil, err
	}
	// Every role decides on Redis time from its first step (invariant 9).
	if err := a.clock.Sync(ctx); err != nil {
		return nil, err
	}
	natsCfg := cfg.NATS
	natsCfg.Types, natsCfg.Registerer = slices.Collect(maps.Keys(cfg.Thresholds.Types)), a.reg
	a.pub, err = dispatch.Dial(ctx, natsCfg, log)
	if err != nil {
		return nil, err
	}
	a.reg.MustRegister(natsConnected(a.pub))
	if a.pub.Mode() == dispatch.JetStream {
		if a.registry, err = a.pub.OpenRegistry(ctx); err != nil {
			return nil, err
		}
	} else {
		log.Warn("NATS core mode: no durable device registry; if Redis loses data, devices only it knew of are forgotten")
	}
	// The alarm's repeat timers are a second sharded queue, with the
	// deadlines' shard count at first and doubled with them.
	if cfg.hasRole("alarm") || cfg.hasRole("api") && a.pub.Mode() == dispatch.JetStream {
		a.timers = a.store.Sub("alarm")
	}
	a.thr = shard.NewThresholds(a.store, cfg.Thresholds.Default, cfg.Thresholds.Types)
	// Redis's data is known whole (or restored) before anything uses it.
	a.guard = guard.New(guard.Options{
		Store: a.store, Alarm: a.timers, Registry: a.registry, Pub: a.pub, Thresholds: a.thr,
		RestoreAlarm: func(ctx context.Context, id, raw string) error {
			if a.alarms == nil {
				return nil
			}
			return a.alarms.PutBack(ctx, id, raw)
		},
		Initial: cfg.Shards.Initial, Now: a.clock.Now, Registerer: a.reg, Log: log.With("role", "guard"),
	})
	if err := a.guard.Establish(ctx); err != nil {
		return nil, err
	}
	if a.topo, err = shard.NewWatcher(ctx, a.store, cfg.Shards.Initial, 500*time.Millisecond, log); err != nil {
		return nil, err
	}
	if err := a.thr.Reload(ctx); err != nil {
		return nil, err
	}
	a.devices = shard.NewDevices(a.store, a.topo, a.thr, a.clock.Now)

	if cfg.hasRole("ingest") {
		mqttTLS, err := cfg.MQTT.TLS.Build()
		if err != nil {
			return nil, fmt.Errorf("mqtt: %w", err)
		}
		a.in, err = ingest.New(ingest.Options{
			Brokers: cfg.MQTT.Brokers, ClientID: cfg.MQTT.ClientID, Username: cfg.MQTT.Username,
			Password: cfg.MQTT.Password, TLS: mqttTLS, Topics: cfg.MQTT.Topics, IDLevel: cfg.MQTT.IDLevel,
			TypeLevel: cfg.MQTT.TypeLevel, GroupLevel: new(cfg.MQTT.GroupLevel), SharedGroup: cfg.MQTT.SharedGroup, QoS: new(byte(cfg.MQTT.QoS)),
			OrderedBroker: cfg.MQTT.OrderedBroker,
			Thresholds:    a.thr, TimestampMode: cfg.Timestamp.Mode, MaxSkew: cfg.Timestamp.MaxSkew,
			Config:   cfg.Ingest,
			Now:      a.clock.Now,
			Registry: a.registry,
		}, a.store, a.topo, a.pub, a.reg, log.With("role", "ingest"))
		if err != nil {
			return nil, err
		}
	}
	if cfg.hasRole("scanner") {
		if a.scanStore, err = shard.Dial(cfg.Redis); err != nil {
			return nil, err
		}
		a.scanStore.ShareGeneration(a.store)
		a.sc, err = scanner.New(scanner.Options{
			Replica: replicaID(), LeaseTTL: cfg.Scanner.LeaseTTL, Poll: cfg.Scanner.Poll,
			Batch: cfg.Scanner.Batch, Thresholds: a.thr, Now: a.live.wrap("scanner", a.clock.Now),
		}, a.scanStore, a.topo, a.pub, a.reg, log.With("role", "scanner"))
		if err != nil {
			return nil, err
		}
	}
	if a.timers != nil {
		if a.rtopo, err = shard.NewWatcher(ctx, a.timers, a.topo.Current().Shards, 500*time.Millisecond, log); err != nil {
			return nil, err
		}
		replica, now := "", a.clock.Now
		if cfg.hasRole("alarm") {
			replica, now = replicaID(), a.live.wrap("alarm", a.clock.Now)
		}
		a.alarms, err = alarm.New(alarm.Options{
			Policy: cfg.Alarm.Policy, Replica: replica, AckWait: cfg.Alarm.AckWait,
			LeaseTTL: cfg.Scanner.LeaseTTL, Poll: cfg.Scanner.Poll, Batch: cfg.Scanner.Batch,
			Rate: cfg.Alarm.Rate, RateTotal: cfg.Alarm.RateTotal,
			Registry: a.registry, Now: now, Storm: cfg.Storm, Threshold: a.thr.For,
		}, a.store, a.topo, a.timers, a.rtopo, a.pub, a.reg, log.With("role", "alarm"))
		if err != nil {
			return nil, err
		}
	}
	if cfg.Timers.Enabled {
		if err := a.startTimers(); err != nil {
			return nil, err
		}
	}
	a.stats = newFleetStats(a)
	if cfg.hasRole("api") {
		if a.httpLn, err = net.Listen("tcp", cfg.HTTP.Addr); err != nil {
			return nil, fmt.Errorf("http: %w (set http.addr / SIGWATCH_HTTP_ADDR)", err)
		}
		a.httpSrv = &http.Server{Handler: a.routes(), ReadHeaderTimeout: 10 * time.Second}
	}

	ok = true
	// Added in start order; the group stops them in reverse.
	a.g.Go("clock", func(ctx context.Context) error { a.clock.Run(ctx); return nil })
	a.g.Go("topology", func(ctx context.Context) error { a.topo.Run(ctx); return nil })
	a.guard.Watch(a.topo, a.rtopo)
	a.g.Go("guard", a.guard.Run)
	if a.registry != nil {
		a.g.Go("registry", a.registry.Run)
	}
	a.g.Go("thresholds", func(ctx context.Context) error { a.thr.Run(ctx, time.Second, log); return nil })
	if a.rtopo != nil {
		a.g.Go("alarm topology", func(ctx context.Context) error { a.rtopo.Run(ctx); return nil })
	}
	if a.httpSrv != nil {
		a.g.Go("http", func(ctx context.Context) error { return serveHTTP(ctx, a.httpSrv, a.httpLn) })
	}
	if a.alarms != nil && cfg.hasRole("alarm") {
		a.g.Go("alarm", a.alarms.Run)
	}
	if a.sc != nil {
		a.g.Go("scanner", a.sc.Run)
	}
	if a.in != nil {
		a.g.Go("ingest", a.in.Run)
	}
	if a.timerSvc != nil {
		a.g.Go("timers", a.timerSvc.Run)
	}
	a.stats.start(a.g)
	go func() {
		select {
		case <-ctx.Done():
		case <-a.g.stopping:
		}
		a.err = a.g.Shutdown()
		if a.err != nil {
			log.Error("fatal", "err", a.err)
		}
		a.closeClients()
		log.Info("sigwatch stopped")
		close(a.done)
	}()
	offset, uncertainty := a.clock.Offset()
	log.Info("sigwatch started", "roles", strings.Join(cfg.Roles, ","), "shards", a.topo.Current().Shards,
		"epoch", a.topo.Current().Epoch, "http", a.HTTPAddr(), "clock_offset", offset.String(), "clock_uncertainty", uncertainty.String())
	return a, nil
}

func (a *App) closeClients() {
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

// HTTPAddr is the address the API listens on ("" without the api role).
func (a *App) HTTPAddr() string {
	if a.httpLn == nil {
		return ""
	}
	return a.httpLn.Addr().String()
}

// startTimers sets up the generic timers: the scanner role fires them, the
// ingest role stores the resets published over NATS, the api role serves
// them.
func (a *App) startTimers() error {
	cfg := a.cfg
	js := a.pub.Mode() == dispatch.JetStream
	if cfg.Timers.NATS && !js {
		a.log.Warn("NATS core mode: timer resets over NATS are off (they need JetStream); the timer API works")
	}
	tc := cfg.Timers
	tc.NATS = tc.NATS && js
	var err error
	a.timerSvc, err = timer.New(timer.Options{
		Replica: replicaID(), Fire: cfg.hasRole("scanner"), Config: tc, Consume: cfg.hasRole("ingest"),
		LeaseTTL: cfg.Scanner.LeaseTTL, Poll: cfg.Scanner.Poll, Batch: cfg.Scanner.Batch, Now: a.clock.Now,
		Limits:    timer.Limits{MaxPayload: cfg.Timers.MaxPayload, MaxIDLen: cfg.Ingest.MaxIDLen},
		FireStore: a.scanStore,
	}, a.store, a.topo, a.pub, a.reg, a.log.With("role", "timers"))
	return err
}
