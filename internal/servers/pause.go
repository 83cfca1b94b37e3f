package servers

import (
	"fmt"
	"syscall"
)

// Pause freezes the Redis process (SIGSTOP), as a long GC pause, a frozen VM or a stalled
// network would; Resume lets it go on (SIGCONT).
func (r *Redis) Pause() error { return r.child.signal(syscall.SIGSTOP) }

// Resume continues a paused Redis.
func (r *Redis) Resume() error { return r.child.signal(syscall.SIGCONT) }

// Pause freezes the mosquitto process (SIGSTOP); Resume lets it go on (SIGCONT).
func (m *Mosquitto) Pause() error { return m.child.signal(syscall.SIGSTOP) }

// Resume continues a paused mosquitto.
func (m *Mosquitto) Resume() error { return m.child.signal(syscall.SIGCONT) }

// signal sends sig to the current run.
func (c *child) signal(sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.cmd.exited() {
		return fmt.Errorf("servers: %s is not running", c.name)
	}
	if err := c.cmd.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("servers: signal %s: %w", c.name, err)
	}
	return nil
}
