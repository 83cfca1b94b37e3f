package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/scanner"
	"github.com/sigwatch/sigwatch/shard"
)

// Config is the whole configuration of one sigwatch process. Every field can
// be set in YAML and overridden by an environment variable named after its
// YAML path: redis.addrs -> SIGWATCH_REDIS_ADDRS (lists are comma-separated).
type Config struct {
	Roles      []string         `yaml:"roles"`
	Log        LogConfig        `yaml:"log"`
	Redis      RedisConfig      `yaml:"redis"`
	NATS       NATSConfig       `yaml:"nats"`
	MQTT       MQTTConfig       `yaml:"mqtt"`
	Thresholds ThresholdsConfig `yaml:"thresholds"`
	Timestamp  TimestampConfig  `yaml:"timestamp"`
	Shards     ShardsConfig     `yaml:"shards"`
	Ingest     IngestConfig     `yaml:"ingest"`
	Scanner    ScannerConfig    `yaml:"scanner"`
	Alarm      AlarmConfig      `yaml:"alarm"`
	HTTP       HTTPConfig       `yaml:"http"`
}

// LogConfig selects the log format ("text" or "json") and level.
type LogConfig struct {
	Format string `yaml:"format"`
	Level  string `yaml:"level"`
}

// TLSConfig is the client TLS set-up shared by Redis, NATS and MQTT.
type TLSConfig struct {
	Enabled            bool   `yaml:"enabled"`
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// RedisConfig points at a single Redis or a Redis Cluster (any node).
type RedisConfig struct {
	Addrs    []string  `yaml:"addrs"`
	Username string    `yaml:"username"`
	Password string    `yaml:"password"`
	DB       int       `yaml:"db"`
	Prefix   string    `yaml:"prefix"`
	TLS      TLSConfig `yaml:"tls"`
}

// NATSConfig points at NATS and shapes the event stream.
type NATSConfig struct {
	URL        string        `yaml:"url"`
	CredsFile  string        `yaml:"creds_file"`
	User       string        `yaml:"user"`
	Password   string        `yaml:"password"`
	Token      string        `yaml:"token"`
	TLS        TLSConfig     `yaml:"tls"`
	Mode       string        `yaml:"mode"`
	Prefix     string        `yaml:"prefix"`
	Stream     string        `yaml:"stream"`
	Duplicates time.Duration `yaml:"duplicates"`
	Storage    string        `yaml:"storage"`
	Replicas   int           `yaml:"replicas"`
	MaxAge     time.Duration `yaml:"max_age"`
}

// MQTTConfig is where signals come from.
type MQTTConfig struct {
	Brokers     []string  `yaml:"brokers"`
	ClientID    string    `yaml:"client_id"`
	Username    string    `yaml:"username"`
	Password    string    `yaml:"password"`
	TLS         TLSConfig `yaml:"tls"`
	Topics      []string  `yaml:"topics"`
	IDLevel     int       `yaml:"id_level"`
	TypeLevel   int       `yaml:"type_level"`
	SharedGroup string    `yaml:"shared_group"`
	QoS         int       `yaml:"qos"` // 0, 1 or 2, run as configured; default 1
}

// ThresholdsConfig says how long devices may stay silent.
type ThresholdsConfig struct {
	Default time.Duration            `yaml:"default"`
	Types   map[string]time.Duration `yaml:"types"`
}

// TimestampConfig picks the signal time: receive time or a payload field.
type TimestampConfig struct {
	Mode    string        `yaml:"mode"`
	MaxSkew time.Duration `yaml:"max_skew"`
}

// ShardsConfig sets the shard count used when Redis holds no topology yet.
type ShardsConfig struct {
	Initial int `yaml:"initial"`
}

// IngestConfig tunes the write path and the watermark.
type IngestConfig struct {
	Batch         int           `yaml:"batch"`
	FlushInterval time.Duration `yaml:"flush_interval"`
	MaxInFlight   int           `yaml:"max_inflight"`
	ProbeInterval time.Duration `yaml:"probe_interval"`
	OutageAfter   time.Duration `yaml:"outage_after"`
	MemberTimeout time.Duration `yaml:"member_timeout"`
	MaxIDLen      int           `yaml:"max_id_len"`
}

// ScannerConfig tunes the expiry path.
type ScannerConfig struct {
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	Poll     time.Duration `yaml:"poll"`
	Batch    int           `yaml:"batch"`
}

// AlarmConfig shapes the alarm lifecycle: how often an alarm repeats while
// its device stays silent, and when a device is damped as flapping.
type AlarmConfig struct {
	Interval    time.Duration `yaml:"interval"`     // before the first repeat
	Backoff     float64       `yaml:"backoff"`      // each next interval is this times the last
	MaxInterval time.Duration `yaml:"max_interval"` // cap of the backoff
	MaxRepeats  int           `yaml:"max_repeats"`  // then resolved/expired; 0: unlimited
	FlapCount   int           `yaml:"flap_count"`   // more lost/recovered cycles than this in flap_window: flapping; 0: off
	FlapWindow  time.Duration `yaml:"flap_window"`
	FlapStable  time.Duration `yaml:"flap_stable"` // a flapping device stable this long ends flapping
	AckWait     time.Duration `yaml:"ack_wait"`    // an event a dead worker held is redelivered after this
}

// HTTPConfig is the admin API and metrics listener.
type HTTPConfig struct {
	Addr  string `yaml:"addr"`
	Token string `yaml:"token"`
}

// DefaultConfig is what sigwatch runs with when nothing is configured.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	if host == "" {
		host = "sigwatch"
	}
	return Config{
		Roles: []string{"ingest", "scanner", "alarm", "api"},
		Log:   LogConfig{Format: "text", Level: "info"},
		Redis: RedisConfig{Addrs: []string{"127.0.0.1:6379"}, Prefix: "sw"},
		NATS: NATSConfig{URL: "nats://127.0.0.1:4222", Mode: "jetstream", Prefix: "sigwatch",
			Stream: "SIGWATCH", Duplicates: 2 * time.Minute, Storage: "file", Replicas: 1},
		MQTT: MQTTConfig{Brokers: []string{"tcp://127.0.0.1:1883"}, ClientID: "sigwatch-" + host,
			Topics: []string{"devices/+/signal"}, IDLevel: 1, TypeLevel: -1, QoS: 1},
		Thresholds: ThresholdsConfig{Default: 30 * time.Second},
		Timestamp:  TimestampConfig{Mode: "receive", MaxSkew: time.Minute},
		Shards:     ShardsConfig{Initial: 16},
		Ingest: IngestConfig{Batch: 256, FlushInterval: time.Millisecond, MaxInFlight: 8192,
			ProbeInterval: ingest.DefaultProbeInterval, OutageAfter: 3 * time.Second, MemberTimeout: 10 * time.Second, MaxIDLen: 256},
		Scanner: ScannerConfig{LeaseTTL: 5 * time.Second, Poll: scanner.DefaultPoll, Batch: 256},
		Alarm: AlarmConfig{Interval: 5 * time.Minute, Backoff: 1, MaxInterval: time.Hour, FlapCount: 5,
			FlapWindow: 10 * time.Minute, FlapStable: 10 * time.Minute, AckWait: 30 * time.Second},
		HTTP: HTTPConfig{Addr: "127.0.0.1:8080"},
	}
}

// LoadConfig reads path (if not empty) over the defaults, then applies
// SIGWATCH_* environment overrides from env, then validates.
func LoadConfig(path string, env []string) (Config, error) {
	cfg := DefaultConfig()
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
			return Config{}, fmt.Errorf("config %s: %w", path, err)
		}
	}
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "SIGWATCH_") {
			vars[k] = v
		}
	}
	if err := overlayEnv(reflect.ValueOf(&cfg).Elem(), "SIGWATCH", vars); err != nil {
		return Config{}, err
	}
	return cfg, cfg.Validate()
}

func overlayEnv(v reflect.Value, prefix string, vars map[string]string) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		name := prefix + "_" + strings.ToUpper(tag)
		fv := v.Field(i)
		if f.Type.Kind() == reflect.Struct {
			if err := overlayEnv(fv, name, vars); err != nil {
				return err
			}
			continue
		}
		s, ok := vars[name]
		if !ok {
			continue
		}
		if err := setFromString(fv, s); err != nil {
			return fmt.Errorf("config: %s=%q: %w", name, s, err)
		}
	}
	return nil
}

func setFromString(fv reflect.Value, s string) error {
	switch fv.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		fv.SetInt(int64(d))
		return nil
	case []string:
		var out []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
		fv.Set(reflect.ValueOf(out))
		return nil
	case map[string]time.Duration:
		m := map[string]time.Duration{}
		for _, p := range strings.Split(s, ",") {
			k, d, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok {
				return errors.New("want type=duration pairs separated by commas, e.g. tracker=2m,meter=15m")
			}
			dur, err := time.ParseDuration(d)
			if err != nil {
				return err
			}
			m[k] = dur
		}
		fv.Set(reflect.ValueOf(m))
		return nil
	}
	switch fv.Kind() {
	case reflect.String:
		fv.SetString(s)
	case reflect.Int:
		n, err := strconv.Atoi(s)
		if err != nil {
			return err
		}
		fv.SetInt(int64(n))
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		fv.SetBool(b)
	case reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return err
		}
		fv.SetFloat(f)
	default:
		return fmt.Errorf("unsupported type %s", fv.Type())
	}
	return nil
}

// Validate refuses configurations that cannot work, saying what to change.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("config: "+format, a...)) }
	for _, r := range c.Roles {
		switch r {
		case "ingest", "scanner", "alarm", "api":
		default:
			bad("unknown role %q (roles: ingest, scanner, alarm, api)", r)
		}
	}
	if len(c.Roles) == 0 {
		bad("no roles: set roles to some of ingest, scanner, alarm, api")
	}
	if len(c.Redis.Addrs) == 0 {
		bad("redis.addrs is empty")
	}
	if err := shard.ValidCount(c.Shards.Initial); err != nil {
		bad("shards.initial: %v", err)
	}
	if c.Thresholds.Default <= 0 {
		bad("thresholds.default must be positive")
	}
	for t, d := range c.Thresholds.Types {
		if d <= 0 {
			bad("thresholds.types.%s must be positive", t)
		}
	}
	if c.Timestamp.Mode != "receive" && c.Timestamp.Mode != "payload" {
		bad("timestamp.mode %q: use receive or payload", c.Timestamp.Mode)
	}
	if c.NATS.Mode != "jetstream" && c.NATS.Mode != "core" {
		bad("nats.mode %q: use jetstream or core", c.NATS.Mode)
	}
	if c.MQTT.QoS < 0 || c.MQTT.QoS > 2 {
		bad("mqtt.qos %d: use 1 (the default) or 2 to have a signal acked only once stored, or 0 to accept losing signals in flight", c.MQTT.QoS)
	}
	if c.MQTT.IDLevel < 0 {
		bad("mqtt.id_level must be >= 0")
	}
	if c.MQTT.TypeLevel == c.MQTT.IDLevel {
		bad("mqtt.type_level must differ from mqtt.id_level (use -1 for none)")
	}
	if c.Scanner.LeaseTTL < time.Second {
		bad("scanner.lease_ttl must be at least 1s")
	}
	if c.Scanner.Batch < 1 || c.Ingest.Batch < 1 {
		bad("scanner.batch and ingest.batch must be at least 1")
	}
	if c.hasRole("alarm") && c.NATS.Mode != "jetstream" {
		bad("the alarm role needs nats.mode jetstream (it consumes lost and recovered events from the stream): use jetstream, or leave alarm out of roles")
	}
	a := c.Alarm
	switch {
	case a.Interval <= 0:
		bad("alarm.interval must be positive")
	case a.Backoff < 1:
		bad("alarm.backoff %v must be at least 1 (1: no backoff)", a.Backoff)
	case a.MaxInterval < a.Interval:
		bad("alarm.max_interval %v must be at least alarm.interval %v", a.MaxInterval, a.Interval)
	}
	if a.MaxRepeats < 0 || a.FlapCount < 0 {
		bad("alarm.max_repeats and alarm.flap_count must be >= 0 (0: unlimited / off)")
	}
	if a.FlapCount > 0 && (a.FlapWindow <= 0 || a.FlapStable <= 0) {
		bad("alarm.flap_window and alarm.flap_stable must be positive (or set alarm.flap_count 0 to turn flap damping off)")
	}
	if a.AckWait < time.Second {
		bad("alarm.ack_wait must be at least 1s")
	}
	if c.hasRole("api") {
		host, _, err := net.SplitHostPort(c.HTTP.Addr)
		if err != nil {
			bad("http.addr %q: %v", c.HTTP.Addr, err)
		} else if !isLoopback(host) && c.HTTP.Token == "" {
			bad("http.addr %s is not loopback: set http.token (SIGWATCH_HTTP_TOKEN) so the API is not open to the network", c.HTTP.Addr)
		}
	}
	return errors.Join(errs...)
}

func (c Config) hasRole(r string) bool {
	for _, x := range c.Roles {
		if x == r {
			return true
		}
	}
	return false
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Build returns the *tls.Config, or nil when TLS is off.
func (t TLSConfig) Build() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	c := &tls.Config{ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls ca_file %s: no certificates found", t.CAFile)
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls cert_file/key_file: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
