package shard

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/tlsconfig"
)

// RedisConfig is the redis section of sigwatch's configuration: a single
// Redis or any nodes of a Redis Cluster, and the key prefix.
type RedisConfig struct {
	Addrs    []string         `yaml:"addrs"`
	Username string           `yaml:"username"`
	Password string           `yaml:"password"`
	DB       int              `yaml:"db"`
	Prefix   string           `yaml:"prefix"`
	TLS      tlsconfig.Config `yaml:"tls"`
}

// DefaultRedisConfig is the redis section when nothing is configured.
func DefaultRedisConfig() RedisConfig {
	return RedisConfig{Addrs: []string{"127.0.0.1:6379"}, Prefix: "sw"}
}

// Validate refuses settings that cannot work.
func (c RedisConfig) Validate() error {
	var errs []error
	if len(c.Addrs) == 0 {
		errs = append(errs, errors.New("redis.addrs is empty"))
	}
	if c.DB < 0 {
		errs = append(errs, errors.New("redis.db must not be negative"))
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
}

// DefaultThresholdsConfig is the thresholds section when nothing is
// configured.
func DefaultThresholdsConfig() ThresholdsConfig { return ThresholdsConfig{Default: 30 * time.Second} }

// Validate refuses thresholds that are not positive.
func (c ThresholdsConfig) Validate() error {
	var errs []error
	if c.Default <= 0 {
		errs = append(errs, errors.New("thresholds.default must be positive"))
	}
	for t, d := range c.Types {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("thresholds.types.%s must be positive", t))
		}
	}
	return errors.Join(errs...)
}

// Dial connects to the Redis of c and returns the store over it; Close
// closes the connection. It is the one way sigwatch opens Redis.
func Dial(c RedisConfig) (*Store, error) {
	tlsConf, err := c.TLS.Build()
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	rc, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: c.Addrs, Username: c.Username, Password: c.Password,
		SelectDB: c.DB, TLSConfig: tlsConf, DisableCache: true,
	})
	if err != nil {
		hint := ""
		if errors.Is(err, syscall.ECONNREFUSED) {
			hint = " (is Redis running? set redis.addrs / SIGWATCH_REDIS_ADDRS)"
		}
		return nil, fmt.Errorf("redis %v: %w%s", c.Addrs, err, hint)
	}
	return NewStore(rc, NewKeys(c.Prefix)), nil
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
