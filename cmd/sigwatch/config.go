package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/yamlenv"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
	"github.com/sigwatch/sigwatch/sinks"
	"github.com/sigwatch/sigwatch/timer"
)

// Config is the whole configuration of one sigwatch process, composed of
// the sections each package owns (with its defaults and rules). Every field
// can be set in YAML and overridden by an environment variable named after
// its YAML path: redis.addrs -> SIGWATCH_REDIS_ADDRS (lists are
// comma-separated).
type Config struct {
	Roles      []string               `yaml:"roles"`
	Log        LogConfig              `yaml:"log"`
	Redis      shard.RedisConfig      `yaml:"redis"`
	NATS       dispatch.Config        `yaml:"nats"`
	MQTT       ingest.MQTTConfig      `yaml:"mqtt"`
	Thresholds shard.ThresholdsConfig `yaml:"thresholds"`
	Timestamp  ingest.TimestampConfig `yaml:"timestamp"`
	Shards     shard.TopologyConfig   `yaml:"shards"`
	Ingest     ingest.Config          `yaml:"ingest"`
	Scanner    queue.Config           `yaml:"scanner"`
	Alarm      alarm.Config           `yaml:"alarm"`
	Storm      alarm.StormConfig      `yaml:"storm"`
	Timers     timer.Config           `yaml:"timers"`
	HTTP       api.Config             `yaml:"http"`
	// Sinks are where alarm notifications go (run by the alarm role).
	Sinks []sinks.Config `yaml:"sinks"`
}

// LogConfig selects the log format ("text" or "json") and level.
type LogConfig struct {
	Format string `yaml:"format"`
	Level  string `yaml:"level"`
}

// roles lists every role a process can run.
var roles = []string{"ingest", "scanner", "alarm", "api"}

// DefaultConfig is what sigwatch runs with when nothing is configured.
func DefaultConfig() Config {
	return Config{
		Roles:      slices.Clone(roles),
		Log:        LogConfig{Format: "text", Level: "info"},
		Redis:      shard.DefaultRedisConfig(),
		NATS:       dispatch.DefaultConfig(),
		MQTT:       ingest.DefaultMQTTConfig(),
		Thresholds: shard.DefaultThresholdsConfig(),
		Timestamp:  ingest.DefaultTimestampConfig(),
		Shards:     shard.DefaultTopologyConfig(),
		Ingest:     ingest.DefaultConfig(),
		Scanner:    queue.DefaultConfig(),
		Alarm:      alarm.DefaultConfig(),
		Storm:      alarm.DefaultStormConfig(),
		Timers:     timer.DefaultConfig(),
		HTTP:       api.DefaultConfig(),
	}
}

// notSettings are the SIGWATCH_* variables sigwatch, its tests and its
// tools read that are not config keys; every other SIGWATCH_* variable
// must name a key, so that a misspelt one is refused, not ignored.
var notSettings = []string{
	"SIGWATCH_CONFIG",                    // the config file, for run and config check
	"SIGWATCH_API",                       // the CLI's API URL
	"SIGWATCH_TIMEOUT",                   // the CLI's deadline per call
	"SIGWATCH_API_CA",                    // the CLI's CA for an https API
	"SIGWATCH_API_CERT",                  // the CLI's client certificate, for mutual TLS
	"SIGWATCH_API_KEY",                   // its key
	"SIGWATCH_TEST_CLOCK_SKEW",           // a test seam, see testClockSkew
	"SIGWATCH_TEST_FREEZE_BEFORE_NOTIFY", // a test seam, see testFreeze
	"SIGWATCH_SCREENSHOTS",               // where the status page tests keep screenshots
	"SIGWATCH_BENCH_CONFIG",              // the benchmark harness
	"SIGWATCH_BENCH_CHILD",
}

// namedVariables are the variables path names for secrets (tokens, sink
// URLs and keys): a SIGWATCH_* one among them is not a setting. A file
// that does not parse names none; Load says what is wrong with it.
func namedVariables(path string) []string {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var f struct {
		HTTP struct {
			Tokens []api.TokenConfig `yaml:"tokens"`
		} `yaml:"http"`
		Sinks []sinks.Config `yaml:"sinks"`
	}
	if yaml.Unmarshal(b, &f) != nil {
		return nil
	}
	var out []string
	for _, t := range f.HTTP.Tokens {
		out = append(out, t.TokenEnv)
	}
	for _, s := range f.Sinks {
		out = append(out, s.URLEnv, s.RoutingKeyEnv)
		out = append(out, s.SecretsEnv...)
	}
	return slices.DeleteFunc(out, func(v string) bool { return v == "" })
}

// LoadConfig reads path (if not empty) over the defaults, then applies
// SIGWATCH_* environment overrides from env, then validates.
func LoadConfig(path string, env []string) (Config, error) {
	cfg, _, err := loadConfig(path, env)
	return cfg, err
}

// loadConfig is LoadConfig that also says which variables it applied.
func loadConfig(path string, env []string) (Config, []string, error) {
	cfg := DefaultConfig()
	applied, err := yamlenv.Load(&cfg, path, "SIGWATCH", env, append(namedVariables(path), notSettings...)...)
	if err != nil {
		return Config{}, nil, err
	}
	return cfg, applied, cfg.Validate()
}

// Validate refuses configurations that cannot work, saying what to change:
// each section by its own package's rules, then the rules across sections.
func (c Config) Validate() error {
	errs := []error{
		c.Redis.Validate(), c.NATS.Validate(), c.MQTT.Validate(), c.Thresholds.Validate(),
		c.Timestamp.Validate(), c.Shards.Validate(), c.Ingest.Validate(), c.Scanner.Validate(), c.Alarm.Validate(), c.Storm.Validate(),
		c.Timers.Validate(), sinks.Validate(c.Sinks),
	}
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	for _, r := range c.Roles {
		if !slices.Contains(roles, r) {
			bad("unknown role %q (roles: %s)", r, strings.Join(roles, ", "))
		}
	}
	if len(c.Roles) == 0 {
		bad("no roles: set roles to some of %s", strings.Join(roles, ", "))
	}
	if c.hasRole("alarm") && c.NATS.Mode != dispatch.JetStream {
		bad("the alarm role needs nats.mode jetstream (it consumes lost and recovered events from the stream): use jetstream, or leave alarm out of roles")
	}
	if len(c.Sinks) > 0 && c.NATS.Mode != dispatch.JetStream {
		bad("sinks need nats.mode jetstream (each has a durable consumer of the alarm notifications): use jetstream, or remove the sinks")
	}
	if c.hasRole("api") {
		errs = append(errs, c.HTTP.Validate())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

// Warnings are settings that work but likely not as the operator means
// them, each saying what to change; Start logs them and `config check`
// prints them.
func (c Config) Warnings() []string {
	var out []string
	if c.hasRole("ingest") {
		// The smallest threshold in force at start; overrides set through
		// the API come later.
		name, thr := "thresholds.default", c.Thresholds.Default
		for _, t := range slices.Sorted(maps.Keys(c.Thresholds.Types)) {
			if d := c.Thresholds.Types[t]; d < thr {
				name, thr = "thresholds.types."+t, d
			}
		}
		if c.Ingest.OutageAfter > thr {
			out = append(out, fmt.Sprintf("ingest.outage_after (%v) is longer than %s (%v): a stall of ingest shorter than "+
				"outage_after is not an outage, and a late backlog is stamped up to outage_after past the evidence of when the broker had it, "+
				"so a device of that threshold may be reported lost for silence inside a stall, or kept alive by a late delivery. "+
				"Set ingest.outage_after below %v, or raise the threshold", c.Ingest.OutageAfter, name, thr, thr))
		}
	}
	if c.hasRole("alarm") && c.NATS.Mode == dispatch.JetStream && c.NATS.Duplicates < 2*time.Second {
		out = append(out, fmt.Sprintf("nats.duplicates (%v) is below 2s: an alarm process's notifications are fenced for at least 1s, "+
			"longer than this window, so one paused past it could publish a notification again. Set nats.duplicates to 2s or more",
			c.NATS.Duplicates))
	}
	return out
}

func (c Config) hasRole(r string) bool { return slices.Contains(c.Roles, r) }
