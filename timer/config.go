package timer

import (
	"errors"
	"fmt"
	"time"
)

// Config is the timers section of sigwatch's configuration.
type Config struct {
	// Enabled runs the generic timers: the API, the NATS path and, in the
	// scanner role, their firing.
	Enabled bool `yaml:"enabled"`
	// NATS takes resets published on sigwatch.timers.set.<queue> (needs
	// nats.mode jetstream; the ingest role stores them).
	NATS bool `yaml:"nats"`
	// MaxPayload bounds a timer's payload in bytes.
	MaxPayload int `yaml:"max_payload"`
	// Fetch is how many reset messages one batch stores at most.
	Fetch int `yaml:"fetch"`
	// AckWait is how long a pulled reset may go unacknowledged before the
	// stream hands it out again.
	AckWait time.Duration `yaml:"ack_wait"`
}

// MaxPayloadLimit bounds timers.max_payload.
const MaxPayloadLimit = 1 << 20

// DefaultConfig is the timers section's default.
func DefaultConfig() Config {
	return Config{Enabled: true, NATS: true, MaxPayload: DefaultMaxPayload, Fetch: 256, AckWait: 30 * time.Second}
}

// Validate refuses settings that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.MaxPayload < 1 || c.MaxPayload > MaxPayloadLimit {
		errs = append(errs, fmt.Errorf("timers.max_payload %d must be between 1 and %d bytes", c.MaxPayload, MaxPayloadLimit))
	}
	if c.Fetch < 1 || c.Fetch > 10_000 {
		errs = append(errs, fmt.Errorf("timers.fetch %d must be between 1 and 10000", c.Fetch))
	}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("timers.ack_wait %v must be at least 1s", c.AckWait))
	}
	return errors.Join(errs...)
}
