package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/internal/tlsconfig"
)

// Mode selects the delivery guarantee.
type Mode string

const (
	// JetStream publishes into a stream and waits for its acknowledgement;
	// Nats-Msg-Id de-duplicates re-publishes after a crash.
	JetStream Mode = "jetstream"
	// Core publishes on core NATS: at most once, no stream.
	Core Mode = "core"
)

// Config is the nats section of sigwatch's configuration: where NATS is,
// how to log in, and the shape of the event stream.
type Config struct {
	URL       string           `yaml:"url"`
	CredsFile string           `yaml:"creds_file"`
	User      string           `yaml:"user"`
	Password  string           `yaml:"password"`
	Token     string           `yaml:"token"`
	TLS       tlsconfig.Config `yaml:"tls"`
	// PingInterval is how often the connection pings its server: two
	// pings unanswered mark a hung or cut-off server stale, and the
	// connection moves to another.
	PingInterval time.Duration `yaml:"ping_interval"`
	// Advisories follows the MQTT listener's client advisories.
	Advisories AdvisoriesConfig `yaml:"advisories"`
	Options    `yaml:",inline"`
}

// Options configure the publisher and the stream.
type Options struct {
	Mode       Mode          `yaml:"mode"`
	Prefix     string        `yaml:"prefix"`     // subject prefix
	Stream     string        `yaml:"stream"`     // stream name
	Duplicates time.Duration `yaml:"duplicates"` // de-duplication window
	Storage    string        `yaml:"storage"`    // "file" or "memory"
	Replicas   int           `yaml:"replicas"`
	MaxAge     time.Duration `yaml:"max_age"`   // 0 keeps messages until other limits apply
	MaxBytes   int64         `yaml:"max_bytes"` // 0: no size limit
	MaxMsgs    int64         `yaml:"max_msgs"`  // 0: no count limit
	// MaxTypes bounds the device types beyond Types that get a subject
	// token of their own; the others publish under "other".
	MaxTypes int `yaml:"max_types"`
	// Types are the configured device types (thresholds.types): each always
	// has its own subject token.
	Types      []string              `yaml:"-"`
	Registerer prometheus.Registerer `yaml:"-"` // where the publisher's metrics go
	MaxPending int                   `yaml:"-"` // outstanding async publishes
	AckWait    time.Duration         `yaml:"-"` // how long a batch waits for acks
	Log        *slog.Logger          `yaml:"-"` // where changes to the stream are told
}

// MinMaxAge is the least nats.max_age: a restore after Redis lost data
// reads the losses since the registry's last checkpoint (every 5 minutes)
// from the stream.
const MinMaxAge = 15 * time.Minute

// DefaultMaxAge is how long the stream keeps events by default: long
// enough for a consumer down over a long weekend to catch up, bounded so
// that the stream does not grow for ever.
const DefaultMaxAge = 7 * 24 * time.Hour

// DefaultConfig is the nats section when nothing is configured; it is the
// only copy of these defaults.
func DefaultConfig() Config {
	return Config{URL: "nats://127.0.0.1:4222", PingInterval: 2 * time.Second, Options: Options{
		Mode: JetStream, Prefix: DefaultPrefix, Stream: "SIGWATCH", Duplicates: 2 * time.Minute,
		Storage: "file", Replicas: 1, MaxAge: DefaultMaxAge, MaxTypes: DefaultMaxTypes, MaxPending: 4096, AckWait: 10 * time.Second,
	}}
}

// Validate refuses settings that cannot work, saying what to change.
func (c Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("nats.url is empty"))
	}
	if c.Mode != JetStream && c.Mode != Core {
		errs = append(errs, fmt.Errorf("nats.mode %q: use jetstream or core", c.Mode))
	}
	if c.Storage != "file" && c.Storage != "memory" {
		errs = append(errs, fmt.Errorf("nats.storage %q: use file or memory", c.Storage))
	}
	for _, n := range []struct {
		key      string
		negative bool
	}{{"replicas", c.Replicas < 0}, {"duplicates", c.Duplicates < 0}, {"max_age", c.MaxAge < 0},
		{"max_bytes", c.MaxBytes < 0}, {"max_msgs", c.MaxMsgs < 0}} {
		if n.negative {
			errs = append(errs, fmt.Errorf("nats.%s must not be negative (0: the default or no limit)", n.key))
		}
	}
	errs = append(errs, c.Advisories.validate())
	if c.PingInterval < 0 {
		errs = append(errs, errors.New("nats.ping_interval must not be negative"))
	}
	if c.MaxAge > 0 && c.MaxAge < MinMaxAge {
		errs = append(errs, fmt.Errorf("nats.max_age %v is shorter than %v: after Redis loses data, sigwatch reads the recent losses from the stream", c.MaxAge, MinMaxAge))
	}
	if c.MaxAge > 0 && c.Duplicates > c.MaxAge {
		errs = append(errs, fmt.Errorf("nats.duplicates %v is longer than nats.max_age %v: the window cannot outlive the events", c.Duplicates, c.MaxAge))
	}
	return errors.Join(errs...)
}

// defaults fills the zero fields of o from DefaultConfig. A negative
// number, like zero, selects the default: max(v, 0) makes it zero for
// cmp.Or.
func (o *Options) defaults() {
	d := DefaultConfig().Options
	o.Mode = cmp.Or(o.Mode, d.Mode)
	o.Prefix = cmp.Or(o.Prefix, d.Prefix)
	o.Stream = cmp.Or(o.Stream, d.Stream)
	o.Storage = cmp.Or(o.Storage, d.Storage)
	o.Duplicates = cmp.Or(max(o.Duplicates, 0), d.Duplicates)
	o.Replicas = cmp.Or(max(o.Replicas, 0), d.Replicas)
	o.MaxPending = cmp.Or(max(o.MaxPending, 0), d.MaxPending)
	o.AckWait = cmp.Or(max(o.AckWait, 0), d.AckWait)
	o.MaxTypes = cmp.Or(max(o.MaxTypes, 0), d.MaxTypes)
}

// Dial connects to the NATS of c and returns a publisher over the
// connection, with the stream set up; Close closes it. It is the one way
// sigwatch opens NATS.
func Dial(ctx context.Context, c Config, log *slog.Logger) (*Bus, error) {
	nc, err := connect(c, log)
	if err != nil {
		return nil, err
	}
	// Before anything is created on it: an old server takes the stream
	// and fails only at the first consumer.
	if c.Mode != Core {
		if err := checkServerVersion(nc.ConnectedUrlRedacted(), nc.ConnectedServerVersion()); err != nil {
			nc.Close()
			return nil, err
		}
	}
	opts := c.Options
	opts.Log = log
	p, err := New(ctx, nc, opts)
	if err != nil {
		nc.Close()
		return nil, err
	}
	p.owned = true
	return p, nil
}

// connect opens the NATS connection of c, to any of the servers its URL
// lists (comma-separated). It reconnects for ever, to any server of the
// list or of the cluster, 250ms apart per server.
func connect(c Config, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("sigwatch"), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		// A server that hangs or is cut off keeps the connection open and
		// silent; missed pongs, not TCP, tell within a few seconds, and the
		// connection moves to another server.
		nats.PingInterval(cmp.Or(c.PingInterval, DefaultConfig().PingInterval)), nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrl()) }),
	}
	opts = append(opts, extra...)
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
		hint := ""
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, nats.ErrNoServers) {
			hint = " (is NATS running? set nats.url / SIGWATCH_NATS_URL)"
		}
		return nil, fmt.Errorf("nats %s: %w%s", c.URL, err, hint)
	}
	return nc, nil
}
