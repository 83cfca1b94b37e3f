package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/scanner"
	"github.com/sigwatch/sigwatch/shard"
)

// App is one running sigwatch process: the roles it was given, wired to
// Redis, NATS and the broker.
type App struct {
	cfg Config
	log *slog.Logger
	reg *prometheus.Registry
	rc  rueidis.Client
	// scanRC is the scanner role's own Redis client (nil without the
	// role): its claims, registry reads and settles are small and
	// latency-bound, and on the shared client they would queue behind
	// ingest's large pipelined batches.
	scanRC rueidis.Client
	nc     *nats.Conn
	store  *shard.Store
	topo   *shard.Watcher
	thr    *shard.Thresholds
	pub    *dispatch.Publisher
	in     *ingest.Ingest
	sc     *scanner.Scanner

	// timers and rtopo are the alarm's repeat timer queue and its
	// topology; alarms serves the alarm role and the API's ack and mutes
	// (nil when NATS runs in core mode).
	timers *shard.Store
	rtopo  *shard.Watcher
	alarms *alarm.Alarms

	httpLn  net.Listener
	httpSrv *http.Server

	cancel context.CancelFunc
	wg     sync.WaitGroup
	errMu  sync.Mutex
	err    error
	done   chan struct{}
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
	a := &App{cfg: cfg, log: log, reg: prometheus.NewRegistry(), done: make(chan struct{})}
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ok := false
	defer func() {
		if !ok {
			a.closeClients()
		}
	}()

	redisTLS, err := cfg.Redis.TLS.Build()
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	newRedis := func() (rueidis.Client, error) {
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress: cfg.Redis.Addrs, Username: cfg.Redis.Username, Password: cfg.Redis.Password,
			SelectDB: cfg.Redis.DB, TLSConfig: redisTLS, DisableCache: true,
		})
		if err != nil {
			return nil, fmt.Errorf("redis %v: %w%s", cfg.Redis.Addrs, err, hint(err, "Redis", "redis.addrs / SIGWATCH_REDIS_ADDRS"))
		}
		return c, nil
	}
	if a.rc, err = newRedis(); err != nil {
		return nil, err
	}
	a.store = shard.NewStore(a.rc, shard.NewKeys(cfg.Redis.Prefix))
	if a.topo, err = shard.NewWatcher(ctx, a.store, cfg.Shards.Initial, 500*time.Millisecond, log); err != nil {
		return nil, err
	}
	a.thr = shard.NewThresholds(a.store, cfg.Thresholds.Default, cfg.Thresholds.Types)
	if err := a.thr.Reload(ctx); err != nil {
		return nil, err
	}

	if a.nc, err = connectNATS(cfg.NATS, log); err != nil {
		return nil, err
	}
	a.pub, err = dispatch.New(ctx, a.nc, dispatch.Options{
		Mode: dispatch.Mode(cfg.NATS.Mode), Prefix: cfg.NATS.Prefix, Stream: cfg.NATS.Stream,
		Duplicates: cfg.NATS.Duplicates, Storage: cfg.NATS.Storage, Replicas: cfg.NATS.Replicas, MaxAge: cfg.NATS.MaxAge,
	})
	if err != nil {
		return nil, err
	}

	if cfg.hasRole("ingest") {
		mqttTLS, err := cfg.MQTT.TLS.Build()
		if err != nil {
			return nil, fmt.Errorf("mqtt: %w", err)
		}
		a.in, err = ingest.New(ingest.Options{
			Brokers: cfg.MQTT.Brokers, ClientID: cfg.MQTT.ClientID, Username: cfg.MQTT.Username,
			Password: cfg.MQTT.Password, TLS: mqttTLS, Topics: cfg.MQTT.Topics, IDLevel: cfg.MQTT.IDLevel,
			TypeLevel: cfg.MQTT.TypeLevel, SharedGroup: cfg.MQTT.SharedGroup, QoS: byte(cfg.MQTT.QoS),
			Thresholds: a.thr, TimestampMode: cfg.Timestamp.Mode, MaxSkew: cfg.Timestamp.MaxSkew,
			MaxIDLen: cfg.Ingest.MaxIDLen, BatchSize: cfg.Ingest.Batch, FlushInterval: cfg.Ingest.FlushInterval,
			MaxInFlight: cfg.Ingest.MaxInFlight, ProbeInterval: cfg.Ingest.ProbeInterval,
			OutageAfter: cfg.Ingest.OutageAfter, MemberTimeout: cfg.Ingest.MemberTimeout,
		}, a.store, a.topo, a.pub, a.reg, log.With("role", "ingest"))
		if err != nil {
			return nil, err
		}
	}
	if cfg.hasRole("scanner") {
		if a.scanRC, err = newRedis(); err != nil {
			return nil, err
		}
		a.sc, err = scanner.New(scanner.Options{
			Replica: replicaID(), LeaseTTL: cfg.Scanner.LeaseTTL, Poll: cfg.Scanner.Poll,
			Batch: cfg.Scanner.Batch, Thresholds: a.thr,
		}, shard.NewStore(a.scanRC, a.store.Keys()), a.topo, a.pub, a.reg, log.With("role", "scanner"))
		if err != nil {
			return nil, err
		}
	}
	if cfg.hasRole("alarm") || cfg.hasRole("api") && a.pub.Mode() == dispatch.JetStream {
		// The repeat timers are a second sharded queue; it starts with the
		// deadlines' shard count and is doubled with them.
		a.timers = shard.NewStore(a.rc, a.store.Keys().Alarm())
		if a.rtopo, err = shard.NewWatcher(ctx, a.timers, a.topo.Current().Shards, 500*time.Millisecond, log); err != nil {
			return nil, err
		}
		replica := ""
		if cfg.hasRole("alarm") {
			replica = replicaID()
		}
		ac := cfg.Alarm
		a.alarms, err = alarm.New(alarm.Options{
			Policy: alarm.Policy{Interval: ac.Interval, Backoff: ac.Backoff, MaxInterval: ac.MaxInterval,
				MaxRepeats: ac.MaxRepeats, FlapCount: ac.FlapCount, FlapWindow: ac.FlapWindow, FlapStable: ac.FlapStable},
			Replica: replica, Stream: cfg.NATS.Stream, AckWait: ac.AckWait,
			LeaseTTL: cfg.Scanner.LeaseTTL, Poll: cfg.Scanner.Poll, Batch: cfg.Scanner.Batch,
		}, a.store, a.topo, a.timers, a.rtopo, a.pub, a.reg, log.With("role", "alarm"))
		if err != nil {
			return nil, err
		}
	}
	if cfg.hasRole("api") {
		if a.httpLn, err = net.Listen("tcp", cfg.HTTP.Addr); err != nil {
			return nil, fmt.Errorf("http: %w (set http.addr / SIGWATCH_HTTP_ADDR)", err)
		}
		a.httpSrv = &http.Server{Handler: a.routes(), ReadHeaderTimeout: 10 * time.Second}
	}

	ok = true
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	a.goRun("topology", func() error { a.topo.Run(runCtx); return nil })
	a.goRun("thresholds", func() error { a.thr.Run(runCtx, time.Second, log); return nil })
	if a.in != nil {
		a.goRun("ingest", func() error { return a.in.Run(runCtx) })
	}
	if a.sc != nil {
		a.goRun("scanner", func() error { return a.sc.Run(runCtx) })
	}
	if a.rtopo != nil {
		a.goRun("alarm topology", func() error { a.rtopo.Run(runCtx); return nil })
	}
	if a.alarms != nil && cfg.hasRole("alarm") {
		a.goRun("alarm", func() error { return a.alarms.Run(runCtx) })
	}
	if a.httpSrv != nil {
		go func() {
			if err := a.httpSrv.Serve(a.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.fail(fmt.Errorf("http: %w", err))
			}
		}()
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-runCtx.Done():
		}
		a.shutdown()
	}()
	log.Info("sigwatch started", "roles", strings.Join(cfg.Roles, ","), "shards", a.topo.Current().Shards,
		"epoch", a.topo.Current().Epoch, "http", a.HTTPAddr())
	return a, nil
}

func (a *App) goRun(name string, f func() error) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := f(); err != nil {
			a.fail(fmt.Errorf("%s: %w", name, err))
		}
	}()
}

// fail records the first fatal error and stops the process.
func (a *App) fail(err error) {
	a.errMu.Lock()
	if a.err == nil {
		a.err = err
	}
	a.errMu.Unlock()
	a.log.Error("fatal", "err", err)
	a.cancel()
}

// shutdown stops the roles (ingest and scanner finish their in-flight
// batches and publish what they owe), then the API, then the clients:
// senders before the connections they send on.
func (a *App) shutdown() {
	a.cancel()
	a.wg.Wait()
	if a.httpSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = a.httpSrv.Shutdown(ctx)
		cancel()
	}
	a.closeClients()
	a.log.Info("sigwatch stopped")
	close(a.done)
}

func (a *App) closeClients() {
	if a.nc != nil {
		_ = a.nc.Drain()
		for i := 0; i < 50 && !a.nc.IsClosed(); i++ {
			time.Sleep(20 * time.Millisecond)
		}
		a.nc.Close()
	}
	if a.scanRC != nil {
		a.scanRC.Close()
	}
	if a.rc != nil {
		a.rc.Close()
	}
}

// Stop shuts the process down and waits.
func (a *App) Stop() error {
	a.cancel()
	return a.Wait()
}

// Wait blocks until the process has stopped and returns the fatal error, if any.
func (a *App) Wait() error {
	<-a.done
	a.errMu.Lock()
	defer a.errMu.Unlock()
	return a.err
}

// HTTPAddr is the address the API listens on ("" without the api role).
func (a *App) HTTPAddr() string {
	if a.httpLn == nil {
		return ""
	}
	return a.httpLn.Addr().String()
}

func connectNATS(c NATSConfig, log *slog.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("sigwatch"), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrl()) }),
	}
	if c.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.Token != "" {
		opts = append(opts, nats.Token(c.Token))
	}
	tlsConf, err := c.TLS.Build()
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	if tlsConf != nil {
		opts = append(opts, nats.Secure(tlsConf))
	}
	nc, err := nats.Connect(c.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats %s: %w%s", c.URL, err, hint(err, "NATS", "nats.url / SIGWATCH_NATS_URL"))
	}
	return nc, nil
}

// hint adds a pointer to the address setting when a server could not be
// reached at all; refusals of credentials or certificates speak for
// themselves.
func hint(err error, what, setting string) string {
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, nats.ErrNoServers) {
		return fmt.Sprintf(" (is %s running? set %s)", what, setting)
	}
	return ""
}
