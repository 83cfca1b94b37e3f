package servers

import (
	"fmt"
	"strconv"
	"strings"
)

// ReplOffset is the Redis's replication offset (INFO replication's master_repl_offset): on a
// master, how far its replication stream has gone; on a replica, how far it has applied its
// master's. A replica whose offset is below its master's has not received the master's last
// writes.
func (r *Redis) ReplOffset() (int64, error) {
	info, err := redisDo(r.Addr, r.Password, "INFO", "replication")
	if err != nil {
		return 0, fmt.Errorf("servers: INFO replication of %s: %w", r.Addr, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "master_repl_offset:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("servers: INFO replication of %s has no master_repl_offset", r.Addr)
}

// Do sends one command to the Redis on a new connection and returns its simple, integer or
// bulk-string reply, as a test writes behind a client's back.
func (r *Redis) Do(args ...string) (string, error) {
	out, err := redisDo(r.Addr, r.Password, args...)
	if err != nil {
		return "", fmt.Errorf("servers: %s on %s: %w", args[0], r.Addr, err)
	}
	return out, nil
}
