package sinks

import (
	"context"
	"strconv"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// state is what a sink keeps in Redis, under a hash tag of its own
// ("sink:<name>"), shared by every replica that runs it: the ids it
// delivered (de-duplication), its pace (the budget), and for Alertmanager
// the open alarms it re-sends.
type state struct {
	store *shard.Store
	name  string
	now   func() time.Time
}

// sentFor is how long a delivered id is remembered: longer than any
// redelivery or re-publish of the same notification can come.
const sentFor = 7 * 24 * time.Hour

func (s *state) key(leaf string) string { return s.store.Keys().Tagged("sink:"+s.name, leaf) }

// sent reports whether the sink already took the notification id.
func (s *state) sent(ctx context.Context, id string) (bool, error) {
	r := s.store.Do(ctx, "ZSCORE", []string{s.key("sent")}, id)
	if r.IsNil() {
		return false, nil
	}
	return r.Error() == nil, r.Error()
}

// markSentScript records a delivered id and forgets those older than the
// window.
//
// KEYS[1]: the sent ZSET; ARGV[1]: id; ARGV[2]: now (ms); ARGV[3]: window (ms)
var markSentScript = shard.NewScript(`
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]))
return 1
`)

func (s *state) markSent(ctx context.Context, id string) error {
	now := s.now().UnixMilli()
	return s.store.Exec(ctx, markSentScript, []string{s.key("sent")},
		[]string{id, strconv.FormatInt(now, 10), strconv.FormatInt(sentFor.Milliseconds(), 10)}).Error()
}

// paceScript gives the next send slot of a sink paced every spacing ms:
// one spacing after the last slot, not before now.
//
// KEYS[1]: the pace STRING; ARGV[1]: now (ms); ARGV[2]: spacing (ms)
// Returns: the slot (ms).
var paceScript = shard.NewScript(`
local now = tonumber(ARGV[1])
local slot = math.max(now, tonumber(redis.call('GET', KEYS[1]) or '0'))
redis.call('SET', KEYS[1], slot + tonumber(ARGV[2]), 'PX', math.max(1, slot + tonumber(ARGV[2]) - now) + 60000)
return slot
`)

// pace waits for the sink's next send slot at rate per second (0: none),
// reserved across every replica, and adds the wait to waited.
func (s *state) pace(ctx context.Context, rate float64, waited func(time.Duration)) error {
	if rate <= 0 {
		return nil
	}
	spacing := time.Duration(float64(time.Second) * 1.1 / rate).Round(time.Millisecond)
	now := s.now()
	slot, err := s.store.Exec(ctx, paceScript, []string{s.key("pace")},
		[]string{strconv.FormatInt(now.UnixMilli(), 10), strconv.FormatInt(spacing.Milliseconds(), 10)}).AsInt64()
	if err != nil {
		return err
	}
	wait := time.UnixMilli(slot).Sub(now)
	if wait <= 0 {
		return nil
	}
	waited(wait)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// open keeps the latest notification of an open alarm, to re-send.
func (s *state) open(ctx context.Context, key string, n []byte) error {
	return s.store.Do(ctx, "HSET", []string{s.key("open")}, key, string(n)).Error()
}

// close forgets a resolved alarm.
func (s *state) close(ctx context.Context, key string) error {
	return s.store.Do(ctx, "HDEL", []string{s.key("open")}, key).Error()
}

// opened returns the open alarms' latest notifications.
func (s *state) opened(ctx context.Context) (map[string]string, error) {
	return s.store.Do(ctx, "HGETALL", []string{s.key("open")}).AsStrMap()
}

// resendTurn reports whether this replica re-sends the open alarms now:
// one replica per interval.
func (s *state) resendTurn(ctx context.Context, every time.Duration) bool {
	r := s.store.Do(ctx, "SET", []string{s.key("resend")}, "1", "NX", "PX", strconv.FormatInt(max(every.Milliseconds()-100, 1), 10))
	return r.Error() == nil
}

// saveStatus records the sink's state where every replica's API reads it.
func (s *state) saveStatus(ctx context.Context, v View) error {
	return s.store.Do(ctx, "HSET", []string{s.key("status")}, "state", v.State, "last_error", v.LastError,
		"last_sent", strconv.FormatInt(v.LastSent, 10)).Error()
}

// loadStatus fills v with the state last recorded by any replica.
func (s *state) loadStatus(ctx context.Context, v *View) error {
	m, err := s.store.Do(ctx, "HGETALL", []string{s.key("status")}).AsStrMap()
	if err != nil {
		return err
	}
	if m["state"] != "" {
		v.State = m["state"]
	}
	v.LastError = m["last_error"]
	v.LastSent, _ = strconv.ParseInt(m["last_sent"], 10, 64)
	return nil
}
