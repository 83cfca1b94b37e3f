package ingest

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/internal/tlsconfig"
	"github.com/sigwatch/sigwatch/shard"
)

// MQTTConfig is the mqtt section of sigwatch's configuration: where signals
// come from.
type MQTTConfig struct {
	Brokers     []string         `yaml:"brokers"`
	ClientID    string           `yaml:"client_id"`
	Username    string           `yaml:"username"`
	Password    string           `yaml:"password"`
	TLS         tlsconfig.Config `yaml:"tls"`
	Topics      []string         `yaml:"topics"`
	IDLevel     int              `yaml:"id_level"`
	TypeLevel   int              `yaml:"type_level"`
	GroupLevel  int              `yaml:"group_level"`
	SharedGroup string           `yaml:"shared_group"`
	QoS         int              `yaml:"qos"` // 0, 1 or 2, run as configured
	// Protocol is the MQTT version ingest subscribes with: 3.1.1 or 5.
	Protocol string `yaml:"protocol"`
	// OrderedBroker vouches that the broker delivers all of a session's
	// messages in one order (see Options.OrderedBroker).
	OrderedBroker bool `yaml:"ordered_broker"`
	// Status are the status topics: online/offline reports and wills.
	Status StatusConfig `yaml:"status"`
	// Sparkplug is the Sparkplug B namespace: edge nodes and devices.
	Sparkplug SparkplugConfig `yaml:"sparkplug"`
	// Connections are the broker's reports of client connections.
	Connections ConnectionsConfig `yaml:"connections"`
}

// TimestampConfig is the timestamp section: the signal time is the receive
// time or a payload field.
type TimestampConfig struct {
	Mode    string        `yaml:"mode"`
	MaxSkew time.Duration `yaml:"max_skew"`
}

// Config is the ingest section: the write path and the watermark.
type Config struct {
	Batch         int           `yaml:"batch"`
	FlushInterval time.Duration `yaml:"flush_interval"`
	MaxInFlight   int           `yaml:"max_inflight"`
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// IdleProbeInterval is the probe period while no scanner waits for
	// the watermark; it is kept between probe_interval and a quarter of
	// outage_after.
	IdleProbeInterval time.Duration `yaml:"idle_probe_interval"`
	OutageAfter       time.Duration `yaml:"outage_after"`
	// ReconnectGrace is how long after the broker is back from a restart
	// devices are given to reconnect before their silence counts again.
	ReconnectGrace time.Duration `yaml:"reconnect_grace"`
	MemberTimeout  time.Duration `yaml:"member_timeout"`
	MaxIDLen       int           `yaml:"max_id_len"`
}

// DefaultMQTTConfig is the mqtt section when nothing is configured. The
// client id names a persistent session, whose messages the broker keeps
// while sigwatch restarts, so it stays one per host, "sigwatch-<host>",
// the same across restarts: an id new with every process would leave each
// old session's backlog behind, unread. A second process on the host with
// the default is refused at start (see ClaimClientID), naming the process
// that holds the id; give each its own with SIGWATCH_MQTT_CLIENT_ID.
func DefaultMQTTConfig() MQTTConfig {
	host, _ := os.Hostname()
	if host == "" {
		host = "sigwatch"
	}
	return MQTTConfig{Brokers: []string{"tcp://127.0.0.1:1883"}, ClientID: "sigwatch-" + host,
		Topics: []string{"devices/+/signal"}, IDLevel: 1, TypeLevel: -1, GroupLevel: -1, QoS: int(DefaultQoS), Protocol: Protocol311,
		Status: DefaultStatusConfig(), Sparkplug: DefaultSparkplugConfig()}
}

// DefaultTimestampConfig is the timestamp section when nothing is
// configured.
func DefaultTimestampConfig() TimestampConfig {
	return TimestampConfig{Mode: TimestampReceive, MaxSkew: time.Minute}
}

// DefaultConfig is the ingest section when nothing is configured; with
// the two above it is the only copy of ingest's defaults.
func DefaultConfig() Config {
	return Config{Batch: 256, FlushInterval: time.Millisecond, MaxInFlight: 8192,
		ProbeInterval: DefaultProbeInterval, IdleProbeInterval: DefaultIdleProbeInterval, OutageAfter: 3 * time.Second, ReconnectGrace: DefaultReconnectGrace,
		MemberTimeout: 10 * time.Second, MaxIDLen: shard.DefaultMaxIDLen}
}

// DefaultReconnectGrace is the default ingest.reconnect_grace. Devices
// reconnect to a restarted broker with their own back-off: a fixed 10 s
// retry is common (ESP-IDF's esp-mqtt, Tasmota), and exponential back-off
// from 1 s (paho, the AWS IoT SDKs) reaches 15 s after four failed tries.
// 30 s covers both with room for a reconnection storm; a device silent
// across the restart is reported at most this much later.
const DefaultReconnectGrace = 30 * time.Second

// Validate refuses mqtt settings that cannot work.
func (c MQTTConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.QoS < 0 || c.QoS > 2 {
		bad("mqtt.qos %d: use 1 (the default) or 2 to have a signal acked only once stored, or 0 to accept losing signals in flight", c.QoS)
	}
	if c.Protocol != Protocol311 && c.Protocol != Protocol5 {
		bad("mqtt.protocol %q: use \"3.1.1\" (the default) or \"5\" (which also reads ttd and next from MQTT 5 user properties)", c.Protocol)
	}
	if c.IDLevel < 0 {
		bad("mqtt.id_level must be >= 0")
	}
	if c.TypeLevel == c.IDLevel {
		bad("mqtt.type_level must differ from mqtt.id_level (use -1 for none)")
	}
	if c.GroupLevel >= 0 && (c.GroupLevel == c.IDLevel || c.GroupLevel == c.TypeLevel) {
		bad("mqtt.group_level must differ from mqtt.id_level and mqtt.type_level (use -1 for none)")
	}
	if strings.ContainsAny(c.SharedGroup, "/+#") {
		bad("mqtt.shared_group %q must not contain '/', '+' or '#'", c.SharedGroup)
	}
	errs = append(errs, c.Status.Validate(), c.Sparkplug.Validate(), c.Connections.Validate())
	return errors.Join(errs...)
}

// Validate refuses an unknown timestamp mode.
func (c TimestampConfig) Validate() error {
	if c.Mode != TimestampReceive && c.Mode != TimestampPayload {
		return fmt.Errorf("timestamp.mode %q: use receive or payload", c.Mode)
	}
	if c.MaxSkew < 0 {
		return errors.New("timestamp.max_skew must not be negative")
	}
	return nil
}

// defaultDuration is the default of the ingest duration named key, the
// example a refusal gives.
func defaultDuration(key string) time.Duration {
	d := DefaultConfig()
	return map[string]time.Duration{"flush_interval": d.FlushInterval, "probe_interval": d.ProbeInterval,
		"outage_after": d.OutageAfter, "reconnect_grace": d.ReconnectGrace, "member_timeout": d.MemberTimeout}[key]
}

// Validate refuses write-path settings that cannot work.
func (c Config) Validate() error {
	var errs []error
	for _, n := range []struct {
		key string
		v   int
	}{{"batch", c.Batch}, {"max_inflight", c.MaxInFlight}, {"max_id_len", c.MaxIDLen}} {
		if n.v < 1 {
			errs = append(errs, fmt.Errorf("ingest.%s %d must be at least 1", n.key, n.v))
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"flush_interval", c.FlushInterval}, {"probe_interval", c.ProbeInterval}, {"outage_after", c.OutageAfter},
		{"reconnect_grace", c.ReconnectGrace}, {"member_timeout", c.MemberTimeout}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("ingest.%s %v must be positive, e.g. %v", d.key, d.v, defaultDuration(d.key)))
		}
	}
	if c.IdleProbeInterval < 0 {
		errs = append(errs, fmt.Errorf("ingest.idle_probe_interval %v must not be negative", c.IdleProbeInterval))
	}
	return errors.Join(errs...)
}
