package shard

import (
	"context"
	"fmt"
	"time"
)

// timeScript reads the server time of the Redis node that holds the
// watermark. A script, not a bare TIME, so that in a cluster every process
// reads the same node's clock: the node of the key's slot.
//
// KEYS[1]: watermark key (only routes the call)
// Returns: {seconds, microseconds}, as TIME.
var timeScript = NewScript(`return redis.call('TIME')`)

// Time returns Redis server time: sigwatch's one clock (see
// internal/clock).
func (s *Store) Time(ctx context.Context) (time.Time, error) {
	v, err := timeScript.exec(ctx, s.c, []string{s.k.Watermark()}, nil).tuple(2)
	var sec, usec int64
	if err == nil {
		if sec, err = v[0].AsInt64(); err == nil {
			usec, err = v[1].AsInt64()
		}
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("shard: server time: %w", err)
	}
	return time.Unix(sec, usec*1000), nil
}
