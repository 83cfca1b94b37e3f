package alarm

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Config is the alarm section of sigwatch's configuration: the policy of
// every alarm, and how long an event a dead worker held waits before it is
// delivered to another.
type Config struct {
	Policy  `yaml:",inline"`
	AckWait time.Duration `yaml:"ack_wait"`
	// Workers bounds the events a process handles at once.
	Workers int `yaml:"workers"`
	// Rate caps the notifications of each type per second, and RateTotal
	// those of all types together, across every replica (0: unlimited;
	// else 0.001 to 1000). Notifications beyond them are delayed, never
	// dropped.
	Rate      float64 `yaml:"rate"`
	RateTotal float64 `yaml:"rate_total"`
}

// DefaultConfig is the alarm section when nothing is configured; with
// DefaultPolicy it is the only copy of these defaults.
func DefaultConfig() Config {
	return Config{Policy: DefaultPolicy, AckWait: 30 * time.Second, Workers: 32}
}

// Validate refuses a policy that cannot work, saying what to change.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch {
	case c.Interval <= 0:
		bad("alarm.interval must be positive")
	case c.Backoff < 1:
		bad("alarm.backoff %v must be at least 1 (1: no backoff)", c.Backoff)
	case c.MaxInterval < c.Interval:
		bad("alarm.max_interval %v must be at least alarm.interval %v", c.MaxInterval, c.Interval)
	}
	if c.MaxRepeats < 0 || c.FlapCount < 0 {
		bad("alarm.max_repeats and alarm.flap_count must be >= 0 (0: unlimited / off)")
	}
	if c.FlapCount > 0 && (c.FlapWindow <= 0 || c.FlapStable <= 0) {
		bad("alarm.flap_window and alarm.flap_stable must be positive (or set alarm.flap_count 0 to turn flap damping off)")
	}
	for _, r := range []struct {
		key string
		v   float64
	}{{"alarm.rate", c.Rate}, {"alarm.rate_total", c.RateTotal}} {
		if !(r.v >= 0) || math.IsInf(r.v, 0) || r.v > 0 && (r.v < minRate || r.v > maxRate) {
			bad("%s %v must be a number of notifications per second >= 0 (0: unlimited), and if set between %v and %v",
				r.key, r.v, minRate, maxRate)
		}
	}
	if c.AckWait < time.Second {
		bad("alarm.ack_wait must be at least 1s")
	}
	if c.Workers < 1 || c.Workers > 1024 {
		bad("alarm.workers %d must be between 1 and 1024", c.Workers)
	}
	return errors.Join(errs...)
}
