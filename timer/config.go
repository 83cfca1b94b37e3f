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
	// Queues are settings of named queues; a queue not named takes the
	// defaults of QueueConfig.
	Queues map[string]QueueConfig `yaml:"queues"`
}

// QueueConfig is the settings of one queue.
type QueueConfig struct {
	// Durable journals the queue's resets and cancels in JetStream before
	// they are acknowledged, so that they survive Redis losing data (nil:
	// true). Without it the queue's timers live in Redis only.
	Durable *bool `yaml:"durable"`
}

// Durable reports whether the timers of queue are journalled.
func (c Config) Durable(queue string) bool {
	if d := c.Queues[queue].Durable; d != nil {
		return *d
	}
	return true
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
	for q := range c.Queues {
		if CheckQueue(q) != nil {
			errs = append(errs, fmt.Errorf("timers.queues: %q is not a queue name: use 1 to 64 of A-Z a-z 0-9 _ -", q))
		}
	}
	return errors.Join(errs...)
}
