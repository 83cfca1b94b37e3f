package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/guard"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/clock"
	"github.com/sigwatch/sigwatch/scanner"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/sinks"
	"github.com/sigwatch/sigwatch/stats"
	"github.com/sigwatch/sigwatch/timer"
)

// connect dials Redis and NATS and syncs the clock: every role decides on
// Redis time from its first step (invariant 9).
func (a *App) connect(ctx context.Context) error {
	cfg := a.cfg
	var err error
	if a.store, err = shard.Dial(cfg.Redis); err != nil {
		return err
	}
	if err := a.store.CheckVersion(ctx); err != nil {
		return err
	}
	skew, err := testClockSkew()
	if err != nil {
		return err
	}
	if a.clock, err = clock.New(a.store.Time, clock.Options{Skew: skew}, a.reg, a.log.With("role", "clock")); err != nil {
		return err
	}
	if err := a.clock.Sync(ctx); err != nil {
		return err
	}
	natsCfg := cfg.NATS
	natsCfg.Types, natsCfg.Registerer = slices.Collect(maps.Keys(cfg.Thresholds.Types)), a.reg
	if a.pub, err = dispatch.Dial(ctx, natsCfg, a.log); err != nil {
		return err
	}
	a.reg.MustRegister(natsConnected(a.pub))
	a.deps.Add("redis", a.store.Ping)
	a.deps.Add("nats", func(context.Context) error {
		if !a.pub.Connected() {
			return errors.New("not connected")
		}
		return nil
	})
	if a.pub.Mode() != dispatch.JetStream {
		a.log.Warn("NATS core mode: no durable device registry; if Redis loses data, devices only it knew of are forgotten")
		return nil
	}
	if a.registry, err = a.pub.OpenRegistry(ctx); err != nil || !cfg.Timers.Enabled {
		return err
	}
	a.journal, err = a.pub.OpenTimerJournal(ctx)
	return err
}

// establish makes Redis's data known whole (or restored) before anything
// uses it, then reads the topology and thresholds.
func (a *App) establish(ctx context.Context) error {
	cfg := a.cfg
	// The alarm's repeat timers are a second sharded queue, with the
	// deadlines' shard count at first and doubled with them.
	if cfg.hasRole("alarm") || cfg.hasRole("api") && a.pub.Mode() == dispatch.JetStream {
		a.repeats = a.store.Sub("alarm")
	}
	a.thr = shard.NewThresholds(a.store, cfg.Thresholds.Default, cfg.Thresholds.Types)
	a.thr.Confirm, a.thr.MaxDeclared = cfg.Thresholds.ConfirmAfter, cfg.Thresholds.MaxDeclared
	a.pub.ConfiguredTypes(a.thr.Configured)
	if sp := cfg.MQTT.Sparkplug; sp.Enabled {
		a.thr.UntilNotice = map[string]bool{}
		for _, typ := range []string{sp.NodeType, sp.DeviceType} {
			a.thr.UntilNotice[typ] = !slices.Contains(sp.Periodic, typ)
		}
	}
	a.guard = guard.New(guard.Options{
		Store: a.store, Alarm: a.repeats, Registry: a.registry, Pub: a.pub, Thresholds: a.thr,
		Timers: a.journal, TimerDurable: cfg.Timers.Durable,
		RestoreAlarm: func(ctx context.Context, id, raw string) error {
			if a.alarms == nil {
				return nil
			}
			return a.alarms.PutBack(ctx, id, raw)
		},
		RestoreStorms: func(ctx context.Context, lost []dispatch.DeviceRecord) error {
			if a.alarms == nil {
				return nil
			}
			return a.alarms.RestoreStorms(ctx, lost)
		},
		Initial: cfg.Shards.Initial, Now: a.clock.Now, Registerer: a.reg, Log: a.log.With("role", "guard"),
	})
	if err := a.guard.Establish(ctx); err != nil {
		return err
	}
	var err error
	if a.topo, err = shard.NewWatcher(ctx, a.store, cfg.Shards.Initial, 500*time.Millisecond, a.log); err != nil {
		return err
	}
	if err := a.thr.Reload(ctx); err != nil {
		return err
	}
	a.devices = shard.NewDevices(a.store, a.topo, a.thr, a.clock.Now)
	return nil
}

func (a *App) newIngest(ctx context.Context) error {
	cfg := a.cfg
	if !cfg.hasRole("ingest") {
		return nil
	}
	mqttTLS, err := cfg.MQTT.TLS.Build()
	if err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	// A broker closes the older of two connections with one client id:
	// a second process with this one is refused before it connects.
	if len(cfg.MQTT.Brokers) > 0 {
		if a.claim, err = ingest.ClaimClientID(ctx, a.store, cfg.MQTT.ClientID, a.id, a.log.With("role", "ingest")); err != nil {
			return err
		}
	}
	a.in, err = ingest.New(ingest.Options{
		Brokers: cfg.MQTT.Brokers, ClientID: cfg.MQTT.ClientID, Process: a.id, Username: cfg.MQTT.Username,
		Password: cfg.MQTT.Password, TLS: mqttTLS, Topics: cfg.MQTT.Topics, IDLevel: cfg.MQTT.IDLevel,
		TypeLevel: cfg.MQTT.TypeLevel, GroupLevel: new(cfg.MQTT.GroupLevel), SharedGroup: cfg.MQTT.SharedGroup, QoS: new(byte(cfg.MQTT.QoS)),
		OrderedBroker: cfg.MQTT.OrderedBroker, Protocol: cfg.MQTT.Protocol, Status: cfg.MQTT.Status, Sparkplug: cfg.MQTT.Sparkplug, Connections: cfg.MQTT.Connections,
		Thresholds: a.thr, TimestampMode: cfg.Timestamp.Mode, MaxSkew: cfg.Timestamp.MaxSkew,
		Config: cfg.Ingest, Now: a.clock.Now,
		Registry: a.registry, Beat: func() func() { return a.live.Beat("ingest") },
	}, a.store, a.topo, a.pub, a.reg, a.log.With("role", "ingest"))
	return err
}

func (a *App) newScanner(context.Context) error {
	cfg := a.cfg
	if !cfg.hasRole("scanner") {
		return nil
	}
	var err error
	if a.scanStore, err = shard.Dial(cfg.Redis); err != nil {
		return err
	}
	a.scanStore.ShareGeneration(a.store)
	a.sc, err = scanner.New(scanner.Options{
		Replica: a.id, Config: cfg.Scanner, Thresholds: a.thr, Now: a.live.Wrap("scanner", a.clock.Now),
	}, a.scanStore, a.topo, a.pub, a.reg, a.log.With("role", "scanner"))
	return err
}

// newAlarms sets up the alarms: the alarm role runs them, the api role
// serves their acks and mutes (nil when NATS runs in core mode).
func (a *App) newAlarms(ctx context.Context) error {
	cfg := a.cfg
	if a.repeats == nil {
		return nil
	}
	var err error
	if a.repeatTopo, err = shard.NewWatcher(ctx, a.repeats, a.topo.Current().Shards, 500*time.Millisecond, a.log); err != nil {
		return err
	}
	replica, now := "", a.clock.Now
	if cfg.hasRole("alarm") {
		replica, now = a.id, a.live.Wrap("alarm", a.clock.Now)
	}
	freeze, err := testFreeze()
	if err != nil {
		return err
	}
	a.alarms, err = alarm.New(alarm.Options{
		Policy: cfg.Alarm.Policy, Replica: replica, AckWait: cfg.Alarm.AckWait, Workers: cfg.Alarm.Workers,
		Engine: cfg.Scanner, Rate: cfg.Alarm.Rate, RateTotal: cfg.Alarm.RateTotal,
		Registry: a.registry, Now: now, Storm: cfg.Storm, Threshold: a.thr.For, BeforeNotify: freeze,
	}, a.store, a.topo, a.repeats, a.repeatTopo, a.pub, a.reg, a.log.With("role", "alarm"))
	if err != nil || len(cfg.Sinks) == 0 || !cfg.hasRole("alarm") && !cfg.hasRole("api") {
		return err
	}
	// The sinks' secrets are read and their consumers made at start, so
	// that a sink that cannot work stops it.
	a.sinks, err = sinks.New(ctx, sinks.Options{Sinks: cfg.Sinks, Store: a.store, Pub: a.pub,
		StormDevices: a.alarms.StormDevices, AckWait: cfg.Alarm.AckWait, Registerer: a.reg, Log: a.log.With("role", "sinks"), Now: a.clock.Now})
	return err
}

// newTimers sets up the generic timers: the scanner role fires them, the
// ingest role stores the resets published over NATS, the api role serves
// them.
func (a *App) newTimers(context.Context) error {
	cfg := a.cfg
	if !cfg.Timers.Enabled {
		return nil
	}
	js := a.pub.Mode() == dispatch.JetStream
	if cfg.Timers.NATS && !js {
		a.log.Warn("NATS core mode: timer resets over NATS are off (they need JetStream); the timer API works")
	}
	tc := cfg.Timers
	tc.NATS = tc.NATS && js
	var err error
	a.timerSvc, err = timer.New(timer.Options{
		Replica: a.id, Fire: cfg.hasRole("scanner"), Config: tc, Consume: cfg.hasRole("ingest"),
		Engine: cfg.Scanner, Now: a.clock.Now,
		Limits:    timer.Limits{MaxPayload: cfg.Timers.MaxPayload, MaxIDLen: cfg.Ingest.MaxIDLen},
		FireStore: a.scanStore, Journal: a.journal,
	}, a.store, a.topo, a.pub, a.reg, a.log.With("role", "timers"))
	return err
}

// newAPI sets up the fleet stats every process reports and, with the api
// role, the listener and the routes.
func (a *App) newAPI(context.Context) error {
	cfg := a.cfg
	so := stats.Options{Name: a.id, Roles: cfg.Roles, History: cfg.hasRole("api"), Store: a.store, Gatherer: a.reg,
		Now: a.clock.Now, OutageAfter: cfg.Ingest.OutageAfter, Log: a.log.With("role", "stats")}
	if a.alarms != nil {
		so.Mutes = func(ctx context.Context) (int, error) {
			ms, err := a.alarms.Mutes(ctx)
			return len(ms), err
		}
	}
	a.stats = stats.New(so)
	if !cfg.hasRole("api") {
		return nil
	}
	var err error
	if a.httpLn, err = net.Listen("tcp", cfg.HTTP.Addr); err != nil {
		return fmt.Errorf("http: %w (set http.addr / SIGWATCH_HTTP_ADDR)", err)
	}
	a.api = api.New(api.Options{
		Config: cfg.HTTP, MaxIDLen: cfg.Ingest.MaxIDLen, Store: a.store, Devices: a.devices, Pub: a.pub, Guard: a.guard,
		Stats: a.stats, Registry: a.registry, Ingest: a.in, Alarms: a.alarms, Timers: a.timerSvc, Sinks: a.sinks,
		Gatherer: a.reg, Registerer: a.reg, Stalled: a.live.Stalled, Deps: a.deps, Now: a.clock.Now, Log: a.log,
	})
	return nil
}
