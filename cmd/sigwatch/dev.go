//go:build demo

// `sigwatch dev` starts Redis, Mosquitto and the embedded nats-server, so it
// is built only with the demo tag (`make run`), like the demo. nodemo.go is
// the same command without the tag.

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
)

// defaultDevConfig is the config `sigwatch dev` uses when none is given and
// it runs in the repository (as `make run` does).
const defaultDevConfig = "deploy/sigwatch.yaml"

// cmdDev runs the real service, started as `sigwatch run` starts it, with
// a config file's settings and the SIGWATCH_* environment, on a Redis, a
// NATS with JetStream and an MQTT broker it starts itself: only their
// addresses replace the config's. It prints where everything is at start,
// each lost and recovered device, and where everything is again every
// --remind when events have been printed since: a quiet terminal still
// shows it.
func cmdDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	path := fs.String("config", os.Getenv("SIGWATCH_CONFIG"), "YAML config file (env SIGWATCH_CONFIG; default "+defaultDevConfig+" when there)")
	ports := fs.String("ports", "standard", "standard: MQTT 1883, NATS 4222, Redis 6379 and the API 8080 where free, free ports for the others; free: free ports only")
	dir := fs.String("dir", "", "directory for the servers' data and the logs (default: a new one under the system's temp directory; kept when dev stops)")
	broker := fs.String("broker", "auto", "MQTT broker to start: mosquitto, nats (its MQTT listener), or auto (mosquitto if installed)")
	remind := fs.Duration("remind", 30*time.Second, "print where everything is again this often, when events were printed since (0: only at start)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *ports != "standard" && *ports != "free" {
		return fmt.Errorf("dev: --ports %q: use standard or free", *ports)
	}
	cfgPath, err := devConfigPath(*path)
	if err != nil {
		return err
	}
	cfg, err := LoadConfig(cfgPath, os.Environ())
	if err != nil {
		return err
	}
	if *dir, err = workDir(*dir, "sigwatch-dev-"); err != nil {
		return err
	}
	standard := *ports == "standard"
	fmt.Fprintln(stdout, "sigwatch dev: starting Redis, NATS (JetStream) and an MQTT broker ...")
	srv, err := startLocalServers(*dir, *broker, standard)
	if err != nil {
		return fmt.Errorf("dev: %w (logs in %s)", err, *dir)
	}
	defer srv.stop()

	devAddresses(&cfg, srv, standard)
	logFile, err := os.Create(filepath.Join(*dir, "sigwatch.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	log, err := newLogger(cfg.Log, logFile)
	if err != nil {
		return err
	}
	app, err := Start(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("%w (log: %s)", err, logFile.Name())
	}
	defer app.Stop()
	if err := waitSubscribed(ctx, app); err != nil {
		return fmt.Errorf("dev: %w (log: %s)", err, logFile.Name())
	}

	nc, err := nats.Connect(srv.nats.URL)
	if err != nil {
		return err
	}
	defer nc.Close()
	ev := devEvents{out: stdout}
	for _, subj := range []string{cfg.NATS.Prefix + ".lost.>", cfg.NATS.Prefix + ".recovered.>"} {
		if _, err := nc.Subscribe(subj, ev.on); err != nil {
			return err
		}
	}

	where := devWhere{cfg: cfg, srv: srv, api: "http://" + app.HTTPAddr(), cfgPath: cfgPath, dir: *dir}
	where.print(stdout, true)
	var tick <-chan time.Time
	if *remind > 0 {
		t := time.NewTicker(*remind)
		defer t.Stop()
		tick = t.C
	}
	done := make(chan error, 1)
	go func() { done <- app.Wait() }()
	for {
		select {
		case <-ctx.Done():
			_ = app.Stop()
			fmt.Fprintf(stdout, "\nsigwatch dev: stopped; the logs and the servers' data are kept in %s\n", *dir)
			return nil
		case err := <-done:
			if err == nil {
				err = fmt.Errorf("sigwatch stopped")
			}
			return fmt.Errorf("%w (log: %s)", err, logFile.Name())
		case <-tick:
			ev.remind(func() { where.print(stdout, false) })
		}
	}
}

// devConfigPath is the config file dev reads, made absolute: the one
// asked for, else deploy/sigwatch.yaml when it is there, else none (the
// built-in defaults).
func devConfigPath(asked string) (string, error) {
	p := asked
	if p == "" {
		if _, err := os.Stat(defaultDevConfig); err != nil {
			return "", nil
		}
		p = defaultDevConfig
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	return abs, nil
}

// devAddresses points cfg at the servers dev started. Credentials, TLS, a
// sentinel set and stream replicas would not fit them, so they go too.
func devAddresses(cfg *Config, srv *localServers, standard bool) {
	cfg.Redis.Addrs = []string{srv.redis.Addr}
	cfg.Redis.Username, cfg.Redis.Password = "", ""
	cfg.Redis.TLS, cfg.Redis.Sentinel = DefaultConfig().Redis.TLS, DefaultConfig().Redis.Sentinel
	cfg.NATS.URL, cfg.NATS.Replicas = srv.nats.URL, 1
	cfg.NATS.CredsFile, cfg.NATS.User, cfg.NATS.Password, cfg.NATS.Token = "", "", "", ""
	cfg.NATS.TLS = DefaultConfig().NATS.TLS
	cfg.MQTT.Brokers = []string{srv.brokerURL}
	cfg.MQTT.Username, cfg.MQTT.Password, cfg.MQTT.TLS = "", "", DefaultConfig().MQTT.TLS
	httpAddr := fmt.Sprintf("127.0.0.1:%d", stdHTTPPort)
	if !standard || !portFree(stdHTTPPort) {
		httpAddr = "127.0.0.1:0"
	}
	cfg.HTTP.Addr = httpAddr
}

// devWhere prints where everything dev started is.
type devWhere struct {
	cfg     Config
	srv     *localServers
	api     string // http://host:port
	cfgPath string
	dir     string
	demo    bool // the demo's: it runs on settings of its own
}

func (w devWhere) print(out io.Writer, full bool) {
	mqttPort, natsURL := portOf(w.srv.brokerURL), w.srv.nats.URL
	topic := topicPattern(w.cfg.MQTT)
	example := strings.Replace(topic, "<id>", "pump-1", 1)
	pub := "mosquitto_pub -t " + example + " -m hi"
	if mqttPort != fmt.Sprint(stdMQTTPort) {
		pub = fmt.Sprintf("mosquitto_pub -p %s -t %s -m hi", mqttPort, example)
	}
	// The CLI's hints name the API when it is not where the CLI looks by
	// default, so that each works as pasted.
	apiFlag := ""
	if portOf(w.api) != fmt.Sprint(stdHTTPPort) {
		apiFlag = " --api " + w.api
	}
	cfgName := w.cfgPath
	if cfgName == "" {
		cfgName = "none (built-in defaults)"
	}
	if full {
		fmt.Fprintf(out, "\nsigwatch is running on its own Redis, NATS and %s; Ctrl-C stops everything.\n\n", w.srv.brokerName)
	} else {
		fmt.Fprintln(out)
	}
	fmt.Fprintf(out, "  publish  %s   (broker %s, topic %s)\n", pub, w.srv.brokerURL, topic)
	fmt.Fprintf(out, "  events   bin/sigwatch events%s   (or your own handler: nats sub -s %s '%s.lost.>')\n", apiFlag, natsURL, w.cfg.NATS.Prefix)
	fmt.Fprintf(out, "  status   %s/   (the API: %s/v1/...)\n", w.api, w.api)
	if full {
		fmt.Fprintf(out, "  lost     bin/sigwatch device ls --state lost%s\n", apiFlag)
		fmt.Fprintf(out, "  nats     %s   subjects %s.lost.<type>, %s.recovered.<type>, %s.alarm.<type>, ... (stream %s)\n",
			natsURL, w.cfg.NATS.Prefix, w.cfg.NATS.Prefix, w.cfg.NATS.Prefix, w.cfg.NATS.Stream)
		fmt.Fprintf(out, "  redis    %s\n", w.srv.redis.Addr)
	}
	if w.demo {
		fmt.Fprintf(out, "  config   %s is what make run uses; the demo has settings of its own (silence threshold %v)\n", cfgName, w.cfg.Thresholds.Default)
	} else {
		fmt.Fprintf(out, "  config   %s (with SIGWATCH_* variables; server addresses replaced); silence threshold %v\n", cfgName, w.cfg.Thresholds.Default)
	}
	fmt.Fprintf(out, "  logs     %s   (sigwatch.log; redis/, nats/, mosquitto/; kept when it stops)\n", w.dir)
	var exports []string
	if portOf(w.api) != fmt.Sprint(stdHTTPPort) {
		exports = append(exports, "export SIGWATCH_API="+w.api)
	}
	if portOf(natsURL) != fmt.Sprint(stdNATSPort) {
		exports = append(exports, "export SIGWATCH_NATS_URL="+natsURL)
	}
	if len(exports) > 0 {
		fmt.Fprintf(out, "  Not on the standard ports: in the shell where you run bin/sigwatch,\n")
		for _, e := range exports {
			fmt.Fprintf(out, "           %s\n", e)
		}
	}
	fmt.Fprintln(out)
}

// topicPattern is the first MQTT filter with its id (type, group) level
// named: devices/+/signal -> devices/<id>/signal.
func topicPattern(c ingest.MQTTConfig) string {
	if len(c.Topics) == 0 {
		return ""
	}
	levels := strings.Split(c.Topics[0], "/")
	for i := range levels {
		switch i {
		case c.IDLevel:
			levels[i] = "<id>"
		case c.TypeLevel:
			levels[i] = "<type>"
		case c.GroupLevel:
			levels[i] = "<group>"
		}
	}
	return strings.Join(levels, "/")
}

// devEvents prints each lost and recovered device.
type devEvents struct {
	out     io.Writer
	mu      sync.Mutex
	printed bool // an event line since where everything is was last printed
}

// remind calls print, which prints where everything is, when an event
// line has been printed since the last time.
func (e *devEvents) remind(print func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.printed {
		e.printed = false
		print()
	}
}

func (e *devEvents) on(m *nats.Msg) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now().Format("15:04:05")
	var lost dispatch.Lost
	var rec dispatch.Recovered
	switch {
	case strings.Contains(m.Subject, ".lost.") && json.Unmarshal(m.Data, &lost) == nil:
		fmt.Fprintf(e.out, "%s  lost       %s  (last signal %s)\n", now, lost.Device, time.UnixMilli(lost.LastSeen).Format("15:04:05"))
		e.printed = true
	case strings.Contains(m.Subject, ".recovered.") && json.Unmarshal(m.Data, &rec) == nil:
		fmt.Fprintf(e.out, "%s  recovered  %s\n", now, rec.Device)
		e.printed = true
	}
}
