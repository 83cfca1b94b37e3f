package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sigwatch/sigwatch/internal/yamlenv"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage: sigwatch <command> [flags]

commands:
  run        run the service: sigwatch run --config sigwatch.yaml
  demo       run on embedded Redis, MQTT and NATS with a simulated fleet (make demo)
  dev        run the service on Redis, Mosquitto and NATS it starts itself (make run)
  simulate   publish a simulated fleet's signals to an MQTT broker
  events     follow what sigwatch publishes: [--lost] [--alarms] [--storms] [--system] [--timers] [--invalid]
             [--device ID] [--since 10m | --last N] [--json]
  device     get|rm|threshold|group|ack <id>: one device; ls [--state lost|watched]: pages of devices
  alarm      ls [--state active|acked|muted|flapping|held]: the open alarms
  type       ls | get|rm <type> | set <type> [--threshold D] [--confirm-after D]: a device type's thresholds
  mute       add|ls|rm: mute the alarms of a device or a type for a while
  storm      ls | ack <group>|--fleet: group and fleet storms and their alarms
  sink       ls | test <name>: where alarms go (Alertmanager, PagerDuty, Slack, webhooks)
  timer      get|set|rm <queue> <id>: one generic timer
  audit      [--limit N]: the most recent acks, mutes, removals and other changes, who made them
  stats      fleet counters, rates, fire lag, watermark, shards
  shards     status|double: topology, drain progress, sizes, owners; start a doubling
  config     check [--config F]: validate a config file (or the defaults) with the SIGWATCH_* environment
  healthcheck [URL]: exit 0 when URL (default http://127.0.0.1:8080/readyz) answers 200
  version    print the version

events, device, type, alarm, mute, storm, sink, timer, audit, stats and shards talk to a running
sigwatch's HTTP API: --api URL (env SIGWATCH_API, default http://127.0.0.1:8080),
--token (env SIGWATCH_HTTP_TOKEN), --timeout (env SIGWATCH_TIMEOUT, default 15s);
for an https API, --ca FILE (env SIGWATCH_API_CA) and, with mutual TLS, --cert and --key
(env SIGWATCH_API_CERT, SIGWATCH_API_KEY); they print tables with local times, or the API's JSON with --json.

Every config key can be overridden by an environment variable,
e.g. SIGWATCH_REDIS_ADDRS, SIGWATCH_NATS_URL, SIGWATCH_MQTT_BROKERS.
`

// commands are the verbs of usage, for the "did you mean" of a typo.
var commands = []string{"run", "demo", "dev", "simulate", "events", "device", "type", "alarm", "mute", "storm", "sink",
	"timer", "audit", "stats", "shards", "config", "healthcheck", "version", "help"}

// flagError is a verb's flags refused by its FlagSet, which printed
// nothing: main prints the refusal once, then the verb's flags.
type flagError struct {
	err error
	fs  *flag.FlagSet
}

func (e *flagError) Error() string { return e.err.Error() }
func (e *flagError) Unwrap() error { return e.err }

func (e *flagError) printUsage(w io.Writer) {
	fmt.Fprintf(w, "usage of sigwatch %s:\n", e.fs.Name())
	e.fs.SetOutput(w)
	e.fs.PrintDefaults()
}

// parseFlags parses args into fs, leaving it to main to print a refusal
// or the --help the flag package would print, so that each shows once.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return &flagError{err, fs}
	}
	return nil
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch args[0] {
	case "run":
		err = cmdRun(ctx, args[1:], stderr)
	case "demo":
		err = cmdDemo(ctx, args[1:], stdout, stderr)
	case "dev":
		err = cmdDev(ctx, args[1:], stdout, stderr)
	case "simulate":
		err = cmdSimulate(ctx, args[1:], stdout, stderr)
	case "shards":
		if len(args) > 1 && args[1] == "double" {
			err = cmdShardsDouble(ctx, args[2:], stdout)
		} else {
			err = cmdShards(ctx, args[1:], stdout)
		}
	case "events":
		err = cmdEvents(ctx, args[1:], stdout, stderr)
	case "device":
		err = cmdDevice(ctx, args[1:], stdout)
	case "type":
		err = cmdType(ctx, args[1:], stdout)
	case "mute":
		err = cmdMute(ctx, args[1:], stdout)
	case "stats":
		err = cmdStats(ctx, args[1:], stdout)
	case "alarm":
		err = cmdAlarm(ctx, args[1:], stdout)
	case "storm":
		err = cmdStorm(ctx, args[1:], stdout)
	case "sink":
		err = cmdSink(ctx, args[1:], stdout)
	case "timer":
		err = cmdTimer(ctx, args[1:], stdout)
	case "audit":
		err = cmdAudit(ctx, args[1:], stdout)
	case "config":
		err = cmdConfig(args[1:], stdout, stderr)
	case "healthcheck":
		err = cmdHealthcheck(ctx, args[1:], stdout)
	case "version":
		fmt.Fprintln(stdout, "sigwatch", version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		if s := yamlenv.Closest(args[0], commands); s != "" {
			fmt.Fprintf(stderr, "sigwatch: unknown command %q: did you mean %s? (sigwatch help lists them all)\n", args[0], s)
		} else {
			fmt.Fprintf(stderr, "sigwatch: unknown command %q\n\n%s", args[0], usage)
		}
		return 2
	}
	var fe *flagError
	switch {
	case errors.As(err, &fe) && errors.Is(err, flag.ErrHelp):
		fe.printUsage(stdout)
		return 0
	case errors.As(err, &fe):
		fmt.Fprintln(stderr, "sigwatch:", fe.err)
		fe.printUsage(stderr)
		return 2
	case errors.Is(err, flag.ErrHelp):
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "sigwatch:", err)
		return 1
	}
	return 0
}

func newLogger(c LogConfig, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.Level)); err != nil {
		return nil, fmt.Errorf("log.level %q: use debug, info, warn or error", c.Level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(c.Format) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log.format %q: use text or json", c.Format)
}

func cmdRun(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	path := fs.String("config", os.Getenv("SIGWATCH_CONFIG"), "YAML config file (env SIGWATCH_CONFIG)")
	roles := fs.String("roles", "", "comma-separated roles to run (default: all): ingest,scanner,alarm,api")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := LoadConfig(*path, os.Environ())
	if err != nil {
		return err
	}
	if *roles != "" {
		cfg.Roles = strings.Split(*roles, ",")
		if err := cfg.Validate(); err != nil {
			return err
		}
	}
	log, err := newLogger(cfg.Log, stderr)
	if err != nil {
		return err
	}
	app, err := Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	return app.Wait()
}
