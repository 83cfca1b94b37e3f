package queue

import (
	"errors"
	"time"
)

// Config is the scanner section of sigwatch's configuration: the engine
// settings of every timer family (the deadlines and the alarm's repeats).
type Config struct {
	// LeaseTTL is the lease time of a shard: a dead replica's shards move
	// within about this long.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Poll bounds how long a shard with nothing due sleeps; a write earlier
	// than its head wakes it at once.
	Poll time.Duration `yaml:"poll"`
	// Batch is the claim limit.
	Batch int `yaml:"batch"`
}

// DefaultConfig is the scanner section when nothing is configured; it is
// the only copy of these defaults.
func DefaultConfig() Config {
	return Config{LeaseTTL: 5 * time.Second, Poll: DefaultPoll, Batch: 256}
}

// Default periods of the engine's own duties; they are not configured.
const (
	defaultRebalance  = 500 * time.Millisecond
	defaultDrainCheck = 5 * time.Second
)

// Validate refuses settings that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.LeaseTTL < time.Second {
		errs = append(errs, errors.New("scanner.lease_ttl must be at least 1s"))
	}
	if c.Poll <= 0 {
		errs = append(errs, errors.New("scanner.poll must be positive"))
	}
	if c.Batch < 1 {
		errs = append(errs, errors.New("scanner.batch must be at least 1"))
	}
	return errors.Join(errs...)
}
