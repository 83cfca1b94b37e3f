package shard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/tlsconfig"
)

// RedisConfig is the redis section of sigwatch's configuration: a single
// Redis, any nodes of a Redis Cluster, or the sentinels of a Redis watched
// by Redis Sentinel; and the key prefix.
type RedisConfig struct {
	// Addrs are the Redis or Cluster nodes; with Sentinel.MasterSet, the
	// sentinels.
	Addrs    []string         `yaml:"addrs"`
	Username string           `yaml:"username"`
	Password string           `yaml:"password"`
	DB       int              `yaml:"db"`
	Prefix   string           `yaml:"prefix"`
	TLS      tlsconfig.Config `yaml:"tls"`
	Sentinel SentinelConfig   `yaml:"sentinel"`
}

// SentinelConfig is redis.sentinel: which master the sentinels in
// redis.addrs are asked for. Username and Password, when the sentinels
// require them, are the sentinels' own; redis.username and redis.password
// stay those of the master. The sentinels are reached with redis.tls.
type SentinelConfig struct {
	MasterSet string `yaml:"master_set"`
	Username  string `yaml:"username"`
	Password  string `yaml:"password"`
}

// DefaultRedisConfig is the redis section when nothing is configured.
func DefaultRedisConfig() RedisConfig {
	return RedisConfig{Addrs: []string{"127.0.0.1:6379"}, Prefix: "sw"}
}

// Validate refuses settings that cannot work.
func (c RedisConfig) Validate() error {
	var errs []error
	switch {
	case len(c.Addrs) == 0 && c.Sentinel.MasterSet != "":
		errs = append(errs, errors.New("redis.addrs is empty: with redis.sentinel.master_set, list the sentinels (host:26379)"))
	case len(c.Addrs) == 0:
		errs = append(errs, errors.New("redis.addrs is empty: list the Redis to use, e.g. [127.0.0.1:6379]"))
	}
	if c.DB < 0 {
		errs = append(errs, errors.New("redis.db must not be negative"))
	}
	if strings.ContainsFunc(c.Sentinel.MasterSet, unicode.IsSpace) {
		// Sentinel's events separate fields with spaces, so such a name could not be followed.
		errs = append(errs, fmt.Errorf("redis.sentinel.master_set %q must not contain spaces", c.Sentinel.MasterSet))
	}
	if c.Sentinel.MasterSet == "" {
		if c.Sentinel.Username != "" {
			errs = append(errs, errors.New("redis.sentinel.username is set but redis.sentinel.master_set is not: set the master set the sentinels monitor, or remove the username"))
		}
		if c.Sentinel.Password != "" {
			errs = append(errs, errors.New("redis.sentinel.password is set but redis.sentinel.master_set is not: set the master set the sentinels monitor, or remove the password"))
		}
	}
	return errors.Join(errs...)
}

// TopologyConfig is the shards section: the shard count of a new
// installation.
type TopologyConfig struct {
	// Initial is used only when Redis holds no topology yet.
	Initial int `yaml:"initial"`
}

// DefaultTopologyConfig is the shards section when nothing is configured.
func DefaultTopologyConfig() TopologyConfig { return TopologyConfig{Initial: 16} }

// Validate refuses a shard count that is not a power of two.
func (c TopologyConfig) Validate() error {
	if err := ValidCount(c.Initial); err != nil {
		return fmt.Errorf("shards.initial: %w", err)
	}
	return nil
}

// ThresholdsConfig is the thresholds section: how long devices may stay
// silent, by default and per device type.
type ThresholdsConfig struct {
	Default time.Duration            `yaml:"default"`
	Types   map[string]time.Duration `yaml:"types"`
	// ConfirmAfter is, per device type, how long an offline report (a
	// will, a death, a disconnect) waits before the device is declared
	// lost; a signal inside it cancels the loss. Absent: at once.
	ConfirmAfter map[string]time.Duration `yaml:"confirm_after"`
	// MaxDeclared bounds a deadline a device declares itself (ttd, next):
	// a longer one is clamped to it, and ttd -1 (until further notice)
	// lasts this long.
	MaxDeclared time.Duration `yaml:"max_declared"`
}

// DefaultThresholdsConfig is the thresholds section when nothing is
// configured.
func DefaultThresholdsConfig() ThresholdsConfig {
	return ThresholdsConfig{Default: 30 * time.Second, MaxDeclared: 7 * 24 * time.Hour}
}

// MaxThreshold bounds every threshold: the default, a type's and a
// device's override.
const MaxThreshold = 366 * 24 * time.Hour

// maxThresholdWords is MaxThreshold as a refusal says it.
var maxThresholdWords = fmt.Sprintf("%dh (%d days)", int(MaxThreshold.Hours()), int(MaxThreshold.Hours()/24))

// Validate refuses thresholds that are not positive or above MaxThreshold.
func (c ThresholdsConfig) Validate() error {
	var errs []error
	if c.Default <= 0 || c.Default > MaxThreshold {
		errs = append(errs, fmt.Errorf("thresholds.default %v must be positive and at most %s", c.Default, maxThresholdWords))
	}
	for t, d := range c.Types {
		if d <= 0 || d > MaxThreshold {
			errs = append(errs, fmt.Errorf("thresholds.types.%s %v must be positive and at most %s", t, d, maxThresholdWords))
		}
	}
	for t, d := range c.ConfirmAfter {
		if d < 0 || d > MaxThreshold {
			errs = append(errs, fmt.Errorf("thresholds.confirm_after.%s %v must be from 0 to %s", t, d, maxThresholdWords))
		}
	}
	if c.MaxDeclared <= 0 || c.MaxDeclared > MaxThreshold {
		errs = append(errs, fmt.Errorf("thresholds.max_declared %v must be positive and at most %s", c.MaxDeclared, maxThresholdWords))
	}
	return errors.Join(errs...)
}

// sentinelRefresh is how often a client asks the sentinels for the master
// besides following their +switch-master events, so that a missed event
// does not leave it on a demoted master.
const sentinelRefresh = 5 * time.Second

// Dial connects to the Redis of c and returns the store over it; Close
// closes the connection. It is the one way sigwatch opens Redis. With
// c.Sentinel.MasterSet it asks the sentinels in c.Addrs for the master and
// follows it across failovers.
func Dial(c RedisConfig) (*Store, error) {
	tlsConf, err := c.TLS.Build()
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	opt := rueidis.ClientOption{
		InitAddress: c.Addrs, Username: c.Username, Password: c.Password,
		SelectDB: c.DB, TLSConfig: tlsConf, DisableCache: true,
	}
	if c.Sentinel.MasterSet != "" {
		opt.Sentinel = rueidis.SentinelOption{
			MasterSet: c.Sentinel.MasterSet,
			Username:  c.Sentinel.Username, Password: c.Sentinel.Password,
			TLSConfig: tlsConf,
			// rueidis gives the master's dialer defaults but not this one. Without a
			// keep-alive its connections send no PING, so a frozen sentinel would hold the
			// client forever; without a timeout a dial to a vanished host hangs for minutes.
			Dialer:                  net.Dialer{Timeout: rueidis.DefaultDialTimeout, KeepAlive: rueidis.DefaultTCPKeepAlive},
			TopologyRefreshInterval: sentinelRefresh,
		}
	}
	rc, err := rueidis.NewClient(opt)
	if err != nil {
		what := "redis"
		if c.Sentinel.MasterSet != "" {
			what = fmt.Sprintf("redis sentinels (master set %q)", c.Sentinel.MasterSet)
		}
		return nil, fmt.Errorf("%s %v: %w%s", what, c.Addrs, err, dialHint(c, err))
	}
	return NewStore(rc, NewKeys(c.Prefix)), nil
}

// dialHint says what to check after Dial failed with err, or "".
func dialHint(c RedisConfig, err error) string {
	msg := err.Error()
	switch sentinel := c.Sentinel.MasterSet != ""; {
	case errors.Is(err, syscall.ECONNREFUSED) && sentinel:
		return " (are the sentinels, and the master they name, running? with redis.sentinel.master_set, redis.addrs / SIGWATCH_REDIS_ADDRS list the sentinels, not Redis)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return " (is Redis running? set redis.addrs / SIGWATCH_REDIS_ADDRS)"
	case sentinel && strings.Contains(msg, "unknown command 'SENTINEL'"):
		return " (redis.addrs must list the sentinels, not Redis itself)"
	case sentinel && (strings.Contains(msg, "No such master") || rueidis.IsRedisNil(err)):
		return fmt.Sprintf(" (the sentinels monitor no master set %q: check redis.sentinel.master_set against SENTINEL MASTERS)", c.Sentinel.MasterSet)
	case !sentinel && strings.Contains(msg, "unknown command 'CLUSTER'"):
		return " (if redis.addrs are sentinels, set redis.sentinel.master_set / SIGWATCH_REDIS_SENTINEL_MASTER_SET)"
	}
	return ""
}

// Close closes the store's connection.
func (s *Store) Close() { s.c.Close() }

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.c.Do(ctx, s.c.B().Ping().Build()).Error(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}
