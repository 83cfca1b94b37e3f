package shard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// DeviceView is what sigwatch knows about one device: its deadline, its
// registry entry, its threshold and whether it is lost.
type DeviceView struct {
	Device       string `json:"device"`
	Type         string `json:"type"`
	Group        string `json:"group,omitempty"`
	Watched      bool   `json:"watched"`
	Shard        int    `json:"shard"`
	Deadline     int64  `json:"deadline,omitempty"`
	LastSeen     int64  `json:"last_seen,omitempty"`
	ThresholdMS  int64  `json:"threshold_ms"`
	Lost         bool   `json:"lost"`
	LostDeadline int64  `json:"lost_deadline,omitempty"`
	LostAt       int64  `json:"lost_at,omitempty"`
}

// Known reports whether the device was ever seen and is not removed.
func (v DeviceView) Known() bool { return v.Watched || v.Type != "" || v.Group != "" || v.Lost }

// Devices are the operations on one device across its deadline, the
// registry and the thresholds, under the topology in force.
type Devices struct {
	store *Store
	topo  *Watcher
	thr   *Thresholds
	now   func() time.Time
	// locks serialise the threshold changes of one device in this process.
	locks [64]sync.Mutex
}

// NewDevices returns the device operations over store. now is the
// process's clock (nil: time.Now); it decides whether a deadline is already
// due, a comparison with other hosts' scanners.
func NewDevices(store *Store, topo *Watcher, thr *Thresholds, now func() time.Time) *Devices {
	if now == nil {
		now = time.Now
	}
	return &Devices{store: store, topo: topo, thr: thr, now: now}
}

// Get reads the device id (its deadline as Store.Deadline reads it).
func (d *Devices) Get(ctx context.Context, id string) (DeviceView, error) {
	v := DeviceView{Device: id}
	dl, err := d.store.Deadline(ctx, d.topo.Current(), id)
	if err != nil {
		return v, err
	}
	v.Watched, v.Deadline, v.Shard = dl.Watched, dl.At, dl.Shard
	ds, err := d.store.Devices(ctx, []string{id})
	if err != nil {
		return v, err
	}
	reg := ds[0]
	v.Type, v.Group = reg.Type, reg.Group
	if reg.LostDeadline != 0 && lostCounts(reg.LostDeadline, dl) {
		v.Lost, v.LostDeadline, v.LostAt = true, reg.LostDeadline, reg.LostAt
	}
	v.ThresholdMS = d.thr.For(id, reg.Type).Milliseconds()
	if v.Watched {
		v.LastSeen = v.Deadline - v.ThresholdMS
	}
	return v, nil
}

// fenceLua refuses a caller whose topology is older than the shard's: one
// below the shard's floor (the drain of a doubling has checked the shard
// clean under a newer one), or one with fewer shards than the shard's
// layout allows (a doubling was published after the caller read the
// topology, so the device may also sit in a shard the caller does not
// know). KEYS[2] is the shard's layout, ARGV[1] the caller's epoch and
// ARGV[2] its shard count.
const fenceLua = `
local l = redis.call('HMGET', KEYS[2], 'floor', 'shards')
if tonumber(l[1] or '0') > tonumber(ARGV[1]) or tonumber(l[2] or '0') > tonumber(ARGV[2]) then
  return redis.error_reply('STALE topology epoch ' .. ARGV[1] .. ' of ' .. ARGV[2] .. ' shards')
end
`

// removeScript stops watching a device in one shard, fenced by topology.
//
// KEYS[1]: deadline ZSET of one shard
// KEYS[2]: layout HASH of the shard
// ARGV[1]: epoch of the caller's topology; ARGV[2]: its shard count
// ARGV[3]: device id
// Returns: 1 if the device was watched there, else 0, or the error STALE.
var removeScript = NewScript(fenceLua + `
return redis.call('ZREM', KEYS[1], ARGV[3])`)

// shiftScript moves a device's deadline in one shard by the change of its
// threshold, against its score at that moment, fenced by topology: the
// score is the one truth about the device's last signal (score - old
// threshold), whatever signal landed just before. An absent device (lost,
// or never seen) stays absent: it is not re-added in the past. A deadline
// at or before the horizon is left alone: a scanner may be firing it under
// the threshold in force, and moving it would make its compare-and-remove
// keep it for a second lost event. A lowered threshold never brings the
// deadline closer than the new threshold from now: while thresholds change,
// a signal written under another threshold than the one replaced may sit
// behind the score (GT kept the higher one), so the score alone cannot
// prove the device silent for longer.
//
// KEYS[1]: deadline ZSET of one shard
// KEYS[2]: layout HASH of the shard
// KEYS[3]: wake key of the shard: a lowered deadline may be its new head
// ARGV[1]: epoch of the caller's topology; ARGV[2]: its shard count
// ARGV[3]: device id; ARGV[4]: new threshold - old threshold, ms
// ARGV[5]: horizon, unix ms; ARGV[6]: new threshold, ms
// Returns: the deadline after the call, nil when absent, or the error STALE.
var shiftScript = NewScript(wakeLua + fenceLua + `
local cur = redis.call('ZSCORE', KEYS[1], ARGV[3])
if not cur then return false end
cur = tonumber(cur)
if cur <= tonumber(ARGV[5]) then return string.format('%d', cur) end
local next = cur + tonumber(ARGV[4])
if tonumber(ARGV[4]) < 0 then
  next = math.max(next, math.min(cur, tonumber(ARGV[5]) + tonumber(ARGV[6])))
end
wake(KEYS[3], next)
next = string.format('%d', next)
redis.call('ZADD', KEYS[1], 'XX', next, ARGV[3])
return next`)

// onShards runs op on every shard that may hold id under the topology in
// force, and again, after reading the topology, on the shards a stale one
// missed: shards refused with ErrStaleTopology are tried again, shards done
// are never done twice (op need not be idempotent). A shard keeps its
// index across doublings, so done stays meaningful.
func (d *Devices) onShards(ctx context.Context, id string, op func(t Topology, i int) error) error {
	done := map[int]bool{}
	t := d.topo.Current()
	for attempt := 0; ; attempt++ {
		stale := false
		for _, i := range t.Locate(id) {
			if done[i] {
				continue
			}
			err := op(t, i)
			switch {
			case errors.Is(err, ErrStaleTopology):
				stale = true
			case err != nil:
				return err
			default:
				done[i] = true
			}
		}
		if !stale {
			return nil
		}
		// A doubling raises the layouts just before it publishes the
		// topology: a refusal may come a moment before a newer one can be
		// read.
		if attempt >= staleRetries {
			return fmt.Errorf("%w (epoch %d): no newer topology to place it under; see `sigwatch shards status`", ErrStaleTopology, t.Epoch)
		}
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(staleWait):
			}
		}
		nt, err := d.topo.Refresh(ctx)
		if err != nil {
			return err
		}
		t = nt
	}
}

// A device operation refused for a stale topology reads it again up to
// staleRetries times, staleWait apart.
const (
	staleRetries = 20
	staleWait    = 50 * time.Millisecond
)

// fenceArgs are the first ARGV of removeScript and shiftScript.
func fenceArgs(t Topology, id string) []string {
	return []string{strconv.FormatInt(t.Epoch, 10), strconv.Itoa(t.Shards), id}
}

// Remove stops watching id and forgets it: its deadline in every shard
// that may hold it, its registry entry, lost mark and threshold override.
// removed says whether it was watched. A topology that lags a doubling is
// refused by the shards and read again, so no copy is left behind.
func (d *Devices) Remove(ctx context.Context, id string) (removed bool, err error) {
	err = d.onShards(ctx, id, func(t Topology, i int) error {
		n, err := removeScript.exec(ctx, d.store.c, []string{d.store.k.Timers(Deadlines, i), d.store.k.Layout(i)}, fenceArgs(t, id)).AsInt64()
		if err != nil {
			return fmt.Errorf("shard: remove from shard %d: %w", i, err)
		}
		removed = removed || n == 1
		return nil
	})
	if err != nil {
		return removed, err
	}
	return removed, d.store.forget(ctx, id)
}

// SetThreshold sets id's threshold override (0 removes it). A watched
// device gets its new deadline at once, counted from its last signal, so a
// lowered threshold takes effect without waiting out the old one (the ZADD
// GT of the next signal could not pull it back) — though never sooner than
// the new threshold after the change.
//
// The deadline moves first, by the change of threshold, atomically against
// its score in each shard that may hold it (shiftScript); the override is
// written after. A signal stamped under the old threshold that lands after
// the move can only push the deadline later (GT), never earlier. Changes of
// one device are serialised, in this process and across processes (a lock
// in Redis held for at most thresholdLockTTL), and against changes of the
// device's type (SetType), so that each moves the deadline by the change
// from the threshold it replaced.
func (d *Devices) SetThreshold(ctx context.Context, id string, threshold time.Duration) (DeviceView, error) {
	mu := &d.locks[Hash(id)%uint64(len(d.locks))]
	mu.Lock()
	defer mu.Unlock()
	unlock, err := d.lockThreshold(ctx, id)
	if err != nil {
		return DeviceView{Device: id}, err
	}
	defer unlock()
	// The threshold in force before the change, as ingest stamps with it.
	if err := d.thr.Reload(ctx); err != nil {
		return DeviceView{Device: id}, err
	}
	ds, err := d.store.Devices(ctx, []string{id})
	if err != nil {
		return DeviceView{Device: id}, err
	}
	typ := ds[0].Type
	if typ != "" {
		// A change of the type's thresholds moves the devices without an
		// override: this change must not interleave with it.
		unlockType, err := d.lockType(ctx, typ, nil)
		if err != nil {
			return DeviceView{Device: id}, err
		}
		defer unlockType()
		if err := d.thr.Reload(ctx); err != nil {
			return DeviceView{Device: id}, err
		}
	}
	old := d.thr.For(id, typ)
	next := threshold
	if next <= 0 {
		next = d.thr.base(typ)
	}
	if delta := (next - old).Milliseconds(); delta != 0 {
		horizon := strconv.FormatInt(d.now().UnixMilli(), 10)
		err := d.onShards(ctx, id, func(t Topology, i int) error {
			err := shiftScript.exec(ctx, d.store.c, []string{d.store.k.Timers(Deadlines, i), d.store.k.Layout(i), d.store.k.Wake(Deadlines, i)},
				append(fenceArgs(t, id), strconv.FormatInt(delta, 10), horizon, strconv.FormatInt(next.Milliseconds(), 10))).Error()
			if err != nil && !rueidis.IsRedisNil(err) {
				return fmt.Errorf("shard: set threshold in shard %d: %w", i, err)
			}
			return nil
		})
		if err != nil {
			return DeviceView{Device: id}, err
		}
	}
	if err := d.store.SetOverride(ctx, id, threshold); err != nil {
		return DeviceView{Device: id}, err
	}
	if err := d.thr.Reload(ctx); err != nil {
		return DeviceView{Device: id}, err
	}
	return d.Get(ctx, id)
}

// A threshold change holds its device's lock for at most thresholdLockTTL,
// and waits at most that long for another holder.
const thresholdLockTTL = 5 * time.Second

// unlockScript releases a lock only if the caller still holds it.
//
// KEYS[1]: the lock STRING
// ARGV[1]: the caller's token
// Returns: 1 if released, 0 if the lock had expired or moved on.
var unlockScript = NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// acquire takes the lock key for token with ttl, waiting up to wait for
// another holder; what names what the lock guards, in errors.
func (s *Store) acquire(ctx context.Context, key, token string, ttl, wait time.Duration, what string) error {
	give := time.Now().Add(wait)
	for {
		err := s.c.Do(ctx, s.c.B().Set().Key(key).Value(token).Nx().Px(ttl).Build()).Error()
		if err == nil {
			return nil
		}
		if !rueidis.IsRedisNil(err) {
			return fmt.Errorf("shard: lock %s: %w", what, err)
		}
		if time.Now().After(give) {
			return fmt.Errorf("shard: another change of %s is under way; try again", what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// lockThreshold takes id's threshold lock, waiting for another holder, and
// returns its release.
func (d *Devices) lockThreshold(ctx context.Context, id string) (func(), error) {
	key, token := d.store.k.ThresholdLock(id), rand.Text()
	if err := d.store.acquire(ctx, key, token, thresholdLockTTL, thresholdLockTTL, fmt.Sprintf("the threshold of %q", id)); err != nil {
		return nil, err
	}
	return func() {
		// Released with its own context: the request may be gone, the lock
		// must not wait out its TTL for that.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = unlockScript.exec(rctx, d.store.c, []string{key}, []string{token}).Error()
	}, nil
}
