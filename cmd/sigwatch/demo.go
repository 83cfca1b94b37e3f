//go:build demo

// The demo starts Redis, Mosquitto and an embedded nats-server, so it is built
// only with the demo tag (`make demo`): the service binary links no server.
// nodemo.go is the same command without the tag.

package main

import (
	"cmp"
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
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/fleet"
)

// cmdDemo runs the whole pipeline on servers it starts itself (Redis,
// Mosquitto or the NATS MQTT listener, embedded NATS), on the standard
// ports where free, with a simulated fleet in which some devices go
// silent. The fleet publishes on the README's topic, devices/<id>/signal,
// its types and gateways declared once through ingest, so a device of the
// user's own published there is watched too.
func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	devices := fs.Int("devices", 3000, "simulated devices")
	threshold := fs.Duration("threshold", 5*time.Second, "silence threshold")
	duration := fs.Duration("duration", 0, "stop after this long (0: until Ctrl-C)")
	gatewayEvery := fs.Duration("gateway-every", 20*time.Second, "a whole gateway (a group of 50 devices) goes dark this often (0: never)")
	broker := fs.String("broker", "auto", "MQTT broker to start: mosquitto, nats, or auto (mosquitto if installed)")
	ports := fs.String("ports", "standard", "standard: MQTT 1883, NATS 4222, Redis 6379 and the API 8080 where free; free: free ports only")
	remind := fs.Duration("remind", 30*time.Second, "print where everything is again this often (0: only at start)")
	dirFlag := fs.String("dir", "", "directory for the servers' data and the logs (default: a new one under the system's temp directory; kept when the demo stops)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *ports != "standard" && *ports != "free" {
		return fmt.Errorf("demo: --ports %q: use standard or free", *ports)
	}
	dir, err := workDir(*dirFlag, "sigwatch-demo-")
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "sigwatch demo: starting Redis, NATS and an MQTT broker ...")
	srv, err := startLocalServers(dir, *broker, *ports == "standard")
	if err != nil {
		return fmt.Errorf("demo: %w (logs in %s)", err, dir)
	}
	defer srv.stop()

	cfg := DefaultConfig()
	devAddresses(&cfg, srv, *ports == "standard")
	cfg.MQTT.ClientID = "sigwatch-demo"
	// A gateway's devices signal every second, so their losses come within
	// about a second of each other: a 2s hold lets the storm take them in.
	cfg.Storm.Hold = 2 * time.Second
	cfg.Thresholds.Default = *threshold
	cfg.Alarm.Interval = *threshold // silent devices get a few repeats before they come back
	// Sparkplug needs a broker that keeps one order per session: Mosquitto.
	cfg.MQTT.Sparkplug.Enabled = srv.mosquitto != nil
	logFile, err := os.Create(filepath.Join(dir, "sigwatch.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	app, err := Start(ctx, cfg, slog.New(slog.NewTextHandler(logFile, nil)))
	if err != nil {
		return fmt.Errorf("demo: %w (log: %s)", err, logFile.Name())
	}
	defer app.Stop()
	if err := waitSubscribed(ctx, app); err != nil {
		return fmt.Errorf("demo: %w (log: %s)", err, logFile.Name())
	}

	fl := fleet.New(fleet.Options{
		Broker: srv.brokerURL, Devices: *devices, Interval: time.Second, Types: []string{"meter", "tracker"},
		Topic: "devices/{id}/signal", SilenceEvery: 700 * time.Millisecond, SilenceCount: max(1, *devices/1000),
		SilenceFor: 2 * *threshold, GroupSize: 50, GroupDarkEvery: *gatewayEvery, Seed: uint64(time.Now().UnixNano()),
	})
	if err := declareFleet(ctx, app, fl, *devices); err != nil {
		return fmt.Errorf("demo: %w (log: %s)", err, logFile.Name())
	}

	nc, err := nats.Connect(srv.nats.URL)
	if err != nil {
		return err
	}
	defer nc.Close()
	w := newWatch(stdout, "dev-")
	var node *demoNode
	if cfg.MQTT.Sparkplug.Enabled {
		if node, err = newDemoNode(srv.brokerURL, stdout); err != nil {
			return err
		}
		w.node = node.name()
	}
	if _, err := nc.Subscribe("sigwatch.>", w.onEvent); err != nil {
		return err
	}
	flCtx, stopFleet := context.WithCancel(ctx)
	defer stopFleet()
	go func() {
		if err := fl.Run(flCtx); err != nil {
			fmt.Fprintln(stderr, "fleet:", err)
		}
	}()

	cfgPath, _ := devConfigPath("")
	where := devWhere{cfg: cfg, srv: srv, api: "http://" + app.HTTPAddr(), cfgPath: cfgPath, dir: dir, demo: true}
	fmt.Fprintf(stdout, `
%d simulated devices (types meter and tracker, behind gateways of 50) signal
every second on devices/<id>/signal; a few go silent for %v at a time.
Threshold %v: a silent device is reported lost on sigwatch.lost.<type>, and
sigwatch.recovered.<type> when it comes back; its alarm on
sigwatch.alarm.<type> is raised, repeated every threshold while it stays
silent, and resolved. Every %v a whole gateway goes dark: its devices are
still reported lost one by one, but a person gets one storm (sigwatch.storm)
and one group alarm instead of 50. A device you publish yourself is watched
too, and shown here when it is lost or recovered. Each second below: the
lost and recovered events so far, the alarms raised so far (one per silent
device, one per dark gateway) and the storms.
`, *devices, 2**threshold, *threshold, *gatewayEvery)
	// The node dies between two dark gateways, down as long as one.
	period := cmp.Or(*gatewayEvery, 20*time.Second)
	nodeDies, nodeDown, nodeEvery := period*3/2, 2**threshold, 2*period
	node.intro(stdout, srv.brokerName, nodeDies, nodeDown, nodeEvery)
	where.print(stdout, true)
	if node != nil {
		go func() {
			if err := node.run(flCtx, nodeDies, nodeDown, nodeEvery); err != nil {
				fmt.Fprintln(stderr, "edge node:", err)
			}
		}()
	}

	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var stopAt, again <-chan time.Time
	if *duration > 0 {
		stopAt = time.After(*duration)
	}
	if *remind > 0 {
		t := time.NewTicker(*remind)
		defer t.Stop()
		again = t.C
	}
	lastSignals := 0.0
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case <-stopAt:
			running = false
		case <-again:
			where.print(stdout, false)
		case <-tick.C:
			signals := metricValue(app, "sigwatch_ingest_signals_total")
			watched := 0.0
			if v, err := api.ShardsStatus(ctx, app.store, time.Now()); err == nil {
				watched = float64(v.Devices)
			}
			lost, recovered, p50, p99 := w.stats()
			a := w.alarmCounts()
			fmt.Fprintf(stdout, "%4ds  watched %6.0f  signals/s %7.0f  lost %5d  recovered %5d  alarms raised %4d  storms %3d  fire lag p50 %4dms p99 %4dms\n",
				int(time.Since(start).Seconds()), watched, signals-lastSignals, lost, recovered, a.raised, a.storms, p50, p99)
			lastSignals = signals
		}
	}
	stopFleet()
	lost, recovered, _, p99 := w.stats()
	a := w.alarmCounts()
	fmt.Fprintf(stdout, `
Summary: %d lost events, %d recovered, fire lag p99 %dms, %d signals published.
Alarms: %d raised, %d for single silent devices and %d for dark gateways in %d storms (one alarm
for a gateway, not one per device); %d alarm notifications in all (raised, repeated, resolved).
`, lost, recovered, p99, fl.Sent(), a.raised, a.raised-a.stormRaised, a.stormRaised, a.storms, a.messages)
	node.summary(stdout)
	fmt.Fprintf(stdout, `The demo's log and its servers' data are kept in %s.
Run it for real on your own devices: make run (the same servers, deploy/sigwatch.yaml's settings).
`, dir)
	if *duration > 0 && lost == 0 {
		return errors.New("demo: no device was reported lost")
	}
	return nil
}

// declareFleet gives the fleet's devices their types and gateways, which
// the README's topic does not carry, with their first signal: a signal
// without them keeps what a device has.
func declareFleet(ctx context.Context, app *App, fl *fleet.Fleet, n int) error {
	const chunk = 2000
	for lo := 0; lo < n; lo += chunk {
		sigs := make([]ingest.Sig, 0, chunk)
		for i := lo; i < min(n, lo+chunk); i++ {
			sigs = append(sigs, ingest.Sig{ID: fl.ID(i), Type: fl.Type(i), Group: fl.Group(i)})
		}
		if err := app.in.Signals(ctx, sigs); err != nil {
			return fmt.Errorf("declaring the fleet: %w", err)
		}
	}
	return nil
}

// watch tallies the events the demo receives. It follows which devices
// of each group are lost, so that a storm's end says the most of its
// group lost at once besides the count the event carries.
type watch struct {
	out           io.Writer
	fleet         string // the id prefix of the simulated devices
	node          string // the Sparkplug edge node, also its devices' group ("": none)
	mu            sync.Mutex
	lost          int
	recovered     int
	alarms        alarmCounts
	lags          []int64
	lostGroup     map[string]string // device -> its group, while lost
	lostCount     map[string]int    // group ("" for the fleet) -> devices lost now
	peak          map[string]int    // group ("" for the fleet) -> most lost at once since its storm started
	nodeRecovered int               // the edge node's recovered events since all of it was last back
}

func newWatch(out io.Writer, fleetPrefix string) *watch {
	return &watch{out: out, fleet: fleetPrefix, lostGroup: map[string]string{}, lostCount: map[string]int{}, peak: map[string]int{}}
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
			w.lostNow(ev.Device, ev.Group)
			switch {
			case w.ofNode(ev.Device):
				w.nodeLost(ev)
			case !strings.HasPrefix(ev.Device, w.fleet):
				fmt.Fprintf(w.out, "      your device %s: lost (%s; last signal %s)\n", ev.Device, reasonOf(ev.Reason), time.UnixMilli(ev.LastSeen).Format("15:04:05"))
			}
		}
	case strings.HasPrefix(m.Subject, "sigwatch.recovered."):
		var ev dispatch.Recovered
		if json.Unmarshal(m.Data, &ev) == nil {
			w.recovered++
			w.backNow(ev.Device)
			switch {
			case w.ofNode(ev.Device):
				w.nodeBack()
			case !strings.HasPrefix(ev.Device, w.fleet):
				fmt.Fprintf(w.out, "      your device %s: recovered\n", ev.Device)
			}
		}
	case strings.HasPrefix(m.Subject, "sigwatch.alarm."):
		var ev dispatch.Alarm
		if json.Unmarshal(m.Data, &ev) == nil {
			w.alarms.messages++
			if ev.State == alarm.Raised {
				w.alarms.raised++
				if ev.Device == "" { // a group's or the fleet's storm alarm
					w.alarms.stormRaised++
				}
			}
		}
	case m.Subject == "sigwatch.storm":
		var ev dispatch.Storm
		if json.Unmarshal(m.Data, &ev) == nil {
			w.onStorm(ev)
		}
	}
}

// lostNow and backNow follow the devices lost now, by group and in all.
func (w *watch) lostNow(id, group string) {
	if _, ok := w.lostGroup[id]; ok {
		return
	}
	w.lostGroup[id] = group
	for _, k := range []string{"", "group " + group} {
		w.lostCount[k]++
		w.peak[k] = max(w.peak[k], w.lostCount[k])
	}
}

func (w *watch) backNow(id string) {
	group, ok := w.lostGroup[id]
	if !ok {
		return
	}
	delete(w.lostGroup, id)
	w.lostCount[""]--
	w.lostCount["group "+group]--
}

// onStorm says a storm started, by how many were lost when it did, and
// ended, by the most that were lost at once in it and by how many were
// still lost as it ended (the count its event, `sigwatch events` and
// `storm ls` show).
func (w *watch) onStorm(ev dispatch.Storm) {
	key, what := "", "the fleet"
	if ev.Group != "" {
		key, what = "group "+ev.Group, "group "+ev.Group
	}
	if ev.State == alarm.StormStarted {
		w.alarms.storms++
		w.peak[key] = max(w.lostCount[key], int(ev.Devices))
		fmt.Fprintf(w.out, "      storm started: %s, %d of its %d devices lost so far: one alarm for all of them\n", what, ev.Devices, ev.Watched)
		return
	}
	fmt.Fprintf(w.out, "      storm ended: %s, %d of its %d devices lost at the worst, %d still lost as it ended; its alarm resolved\n",
		what, max(w.peak[key], int(ev.Devices)), ev.Watched, ev.Devices)
}

// alarmCounts tell one alarm per silent device or dark gateway apart from
// the notifications an alarm sends while it lasts.
type alarmCounts struct {
	raised      int // alarms raised: a device's, or a storm's for its devices
	stormRaised int // of which for a storm (a dark gateway, or the fleet)
	storms      int // storms started
	messages    int // notifications: raised, repeat, flapping, resolved
}

func (w *watch) alarmCounts() alarmCounts {
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
