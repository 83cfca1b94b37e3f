//go:build demo

// The demo starts Redis, Mosquitto and an embedded nats-server, so it is built
// only with the demo tag (`make demo`): the service binary links no server.
// nodemo.go is the same command without the tag.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/fleet"
	"github.com/sigwatch/sigwatch/internal/servers"
)

// cmdDemo runs the whole pipeline on servers it starts itself (Redis,
// Mosquitto or the NATS MQTT listener, embedded NATS) on free loopback
// ports, with a simulated fleet in which some devices go silent.
func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	devices := fs.Int("devices", 3000, "simulated devices")
	threshold := fs.Duration("threshold", 5*time.Second, "silence threshold")
	duration := fs.Duration("duration", 0, "stop after this long (0: until Ctrl-C)")
	gatewayEvery := fs.Duration("gateway-every", 20*time.Second, "a whole gateway (a group of 50 devices) goes dark this often (0: never)")
	broker := fs.String("broker", "auto", "MQTT broker to start: mosquitto, nats, or auto (mosquitto if installed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "sigwatch-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	fmt.Fprintln(stdout, "sigwatch demo: starting Redis, NATS and an MQTT broker on free loopback ports ...")
	rd, err := servers.StartRedis(filepath.Join(dir, "redis"), servers.RedisOptions{})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer rd.Stop()
	useMosquitto := *broker == "mosquitto"
	if *broker == "auto" {
		_, err := servers.LookPath("mosquitto")
		useMosquitto = err == nil
	}
	ns, err := servers.StartNATS(filepath.Join(dir, "nats"), servers.NATSOptions{JetStream: true, MQTT: !useMosquitto})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer ns.Shutdown()
	brokerURL, brokerName := ns.MQTTURL, "nats-server MQTT listener"
	if useMosquitto {
		mq, err := servers.StartMosquitto(filepath.Join(dir, "mosquitto"), servers.MosquittoOptions{})
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		defer mq.Stop()
		brokerURL, brokerName = mq.URL, "mosquitto"
	}
	httpPort, err := servers.FreePort()
	if err != nil {
		return err
	}

	cfg := DefaultConfig()
	cfg.Redis.Addrs = []string{rd.Addr}
	cfg.NATS.URL = ns.URL
	cfg.MQTT.Brokers = []string{brokerURL}
	cfg.MQTT.ClientID = "sigwatch-demo"
	// devices/<gateway>/<id>/signal: the gateway is the device's group.
	cfg.MQTT.Topics, cfg.MQTT.GroupLevel, cfg.MQTT.IDLevel = []string{"devices/+/+/signal"}, 1, 2
	// A gateway's devices signal every second, so their losses come within
	// about a second of each other: a 2s hold lets the storm take them in.
	cfg.Storm.Hold = 2 * time.Second
	cfg.Thresholds.Default = *threshold
	cfg.Alarm.Interval = *threshold // silent devices get a few repeats before they come back
	cfg.HTTP.Addr = fmt.Sprintf("127.0.0.1:%d", httpPort)
	logFile, err := os.Create(filepath.Join(dir, "sigwatch.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	app, err := Start(ctx, cfg, slog.New(slog.NewTextHandler(logFile, nil)))
	if err != nil {
		return err
	}
	defer app.Stop()

	nc, err := nats.Connect(ns.URL)
	if err != nil {
		return err
	}
	defer nc.Close()
	w := watch{out: stdout}
	if _, err := nc.Subscribe("sigwatch.>", w.onEvent); err != nil {
		return err
	}

	fl := fleet.New(fleet.Options{
		Broker: brokerURL, Devices: *devices, Interval: time.Second, Types: []string{"meter", "tracker"},
		Topic: "devices/{group}/{id}/signal", SilenceEvery: 700 * time.Millisecond, SilenceCount: max(1, *devices/1000),
		SilenceFor: 2 * *threshold, GroupSize: 50, GroupDarkEvery: *gatewayEvery, Seed: uint64(time.Now().UnixNano()),
	})
	flCtx, stopFleet := context.WithCancel(ctx)
	defer stopFleet()
	go func() {
		if err := fl.Run(flCtx); err != nil {
			fmt.Fprintln(stderr, "fleet:", err)
		}
	}()

	fmt.Fprintf(stdout, `
  redis   %s
  mqtt    %s (%s)
  nats    %s (JetStream stream SIGWATCH)
  http    http://%s  (/metrics, /v1/shards, /v1/devices/{id})
  status  http://%s/  (the status page: open it in a browser)

%d simulated devices behind gateways of 50 signal every second; a few go
silent for %v at a time. Threshold %v: a silent device is reported lost on
sigwatch.lost.<type>, and sigwatch.recovered.<type> when it comes back; its
alarm on sigwatch.alarm.<type> is raised, repeated every threshold while it
stays silent, and resolved. Every %v a whole gateway goes dark: its
devices are still reported lost one by one, but a person gets one storm
(sigwatch.storm) and one group alarm instead of 50.

`, rd.Addr, brokerURL, brokerName, ns.URL, app.HTTPAddr(), app.HTTPAddr(), *devices, 2**threshold, *threshold, *gatewayEvery)

	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var stopAt <-chan time.Time
	if *duration > 0 {
		stopAt = time.After(*duration)
	}
	lastSignals := 0.0
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case <-stopAt:
			running = false
		case <-tick.C:
			signals := metricValue(app, "sigwatch_ingest_signals_total")
			watched := 0.0
			if v, err := api.ShardsStatus(ctx, app.store, time.Now()); err == nil {
				watched = float64(v.Devices)
			}
			lost, recovered, p50, p99 := w.stats()
			fmt.Fprintf(stdout, "%4ds  watched %6.0f  signals/s %7.0f  lost %5d  recovered %5d  alarms %5d  fire lag p50 %4dms p99 %4dms\n",
				int(time.Since(start).Seconds()), watched, signals-lastSignals, lost, recovered, w.alarmCount(), p50, p99)
			lastSignals = signals
		}
	}
	stopFleet()
	lost, recovered, _, p99 := w.stats()
	fmt.Fprintf(stdout, `
Summary: %d lost events, %d recovered, %d alarm notifications, %d storms, fire lag p99 %dms, %d signals published.

Point real devices at sigwatch:   mosquitto_pub -h 127.0.0.1 -p %s -q 1 -t devices/<gateway>/<id>/signal -m ''
Subscribe a business handler:     nats sub -s %s 'sigwatch.lost.>'
Run it for real:                  sigwatch run --config sigwatch.yaml (see README)
`, lost, recovered, w.alarmCount(), w.stormCount(), p99, fl.Sent(), portOf(brokerURL), ns.URL)
	if *duration > 0 && lost == 0 {
		return errors.New("demo: no device was reported lost")
	}
	return nil
}

// watch tallies the events the demo receives.
type watch struct {
	out       io.Writer
	mu        sync.Mutex
	storms    int
	lost      int
	recovered int
	alarms    int
	lags      []int64
}

func (w *watch) onEvent(m *nats.Msg) {
	now := time.Now().UnixMilli()
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case strings.HasPrefix(m.Subject, "sigwatch.lost."):
		var ev dispatch.Lost
		if json.Unmarshal(m.Data, &ev) == nil {
			w.lost++
			w.lags = append(w.lags, now-ev.Deadline)
		}
	case strings.HasPrefix(m.Subject, "sigwatch.recovered."):
		w.recovered++
	case strings.HasPrefix(m.Subject, "sigwatch.alarm."):
		w.alarms++
	case m.Subject == "sigwatch.storm":
		var ev dispatch.Storm
		if json.Unmarshal(m.Data, &ev) == nil {
			what := "one alarm for all of them"
			if ev.State == alarm.StormStarted {
				w.storms++
			} else {
				what = "below the threshold again, its alarm resolved"
			}
			fmt.Fprintf(w.out, "      storm %s: %s %s, %d of %d devices lost: %s\n",
				ev.State, ev.Scope, ev.Group, ev.Devices, ev.Watched, what)
		}
	}
}

func (w *watch) stormCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.storms
}

func (w *watch) alarmCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.alarms
}

func (w *watch) stats() (lost, recovered int, p50, p99 int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	lags := slices.Clone(w.lags)
	slices.Sort(lags)
	if n := len(lags); n > 0 {
		p50, p99 = lags[n/2], lags[min(n-1, n*99/100)]
	}
	return w.lost, w.recovered, p50, p99
}

// metricValue sums a counter or gauge from the app's registry.
func metricValue(a *App, name string) float64 {
	mfs, err := a.reg.Gather()
	if err != nil {
		return 0
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += value(m)
		}
	}
	return sum
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}
