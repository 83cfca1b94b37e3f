package shard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// A type's threshold changed at run time applies to its watched devices as
// a device's own change does (SetThreshold): each deadline moves by the
// change, against its score, fenced by topology, never sooner than the new
// threshold after the change. The devices of the type are found in the
// registry, partition by partition, by their type code inside Redis, and
// moved in batches: one script per shard per batch.

// SetType changes the run-time setting of type typ: change gets the
// setting in force and returns the new one (the zero setting removes it).
// The watched devices of the type without an override of their own get
// their new deadline at once; then the setting is stored; then durable
// (nil: none) gets it, so that the durable registry learns the changes of
// one type in the order Redis stored them. Changes of one type are
// serialised across processes, and against the threshold changes of its
// devices (SetThreshold). It returns what is now in force and how many
// deadlines moved.
func (d *Devices) SetType(ctx context.Context, typ string, change func(TypeSetting) TypeSetting, durable func(TypeSetting) error) (TypeView, int, error) {
	// A change once begun is carried to its end even when its caller gives
	// up (an HTTP request's deadline): stopping between the moves and the
	// write of the setting would leave deadlines moved for a threshold not
	// in force. It stops only if its lock may have lapsed, so that two
	// changes never move deadlines at once.
	work, cancel := context.WithTimeout(context.WithoutCancel(ctx), typeChangeTimeout)
	defer cancel()
	unlock, err := d.lockType(ctx, typ, cancel)
	if err != nil {
		return TypeView{Type: typ}, 0, err
	}
	defer unlock()
	ctx = work
	if err := d.thr.Reload(ctx); err != nil {
		return TypeView{Type: typ}, 0, err
	}
	set := change(d.thr.setting(typ))
	old, next := d.thr.base(typ), set.Threshold
	if next <= 0 {
		next = d.thr.configured(typ)
	}
	moved := 0
	if delta := (next - old).Milliseconds(); delta != 0 {
		if moved, err = d.shiftType(ctx, typ, delta, next); err != nil {
			return TypeView{Type: typ}, moved, err
		}
	}
	if err := d.store.writeTypeSetting(ctx, typ, set); err != nil {
		return TypeView{Type: typ}, moved, err
	}
	if err := d.thr.Reload(ctx); err != nil {
		return TypeView{Type: typ}, moved, err
	}
	if durable != nil {
		if err := durable(set); err != nil {
			return TypeView{Type: typ}, moved, err
		}
	}
	return d.thr.Type(typ), moved, nil
}

// typeChangeTimeout bounds a type's change once begun: moving about
// 100,000 deadlines took 0.8 s.
const typeChangeTimeout = 5 * time.Minute

// typePage is how many registry partitions one round trip searches for a
// type's devices; typeBatch how many devices one script moves.
const (
	typePage  = 32
	typeBatch = 256
)

// shiftType moves the deadline of every watched device of typ without an
// override by delta ms (see shiftTypeScript), and returns how many moved.
func (d *Devices) shiftType(ctx context.Context, typ string, delta int64, next time.Duration) (int, error) {
	code, ok, err := d.store.knownTypeCode(ctx, typ)
	if err != nil || !ok {
		return 0, err // no device ever had the type
	}
	horizon := strconv.FormatInt(d.now().UnixMilli(), 10)
	args := []string{strconv.FormatInt(delta, 10), horizon, strconv.FormatInt(next.Milliseconds(), 10)}
	moved := 0
	for p := 0; p < registryParts; p += typePage {
		ids, err := d.store.devicesOfType(ctx, code, p, min(p+typePage, registryParts))
		if err != nil {
			return moved, err
		}
		ids = slices.DeleteFunc(ids, d.thr.overridden)
		n, err := d.shiftMany(ctx, ids, args)
		moved += n
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// knownTypeCode returns the code of typ without assigning one.
func (s *Store) knownTypeCode(ctx context.Context, typ string) (string, bool, error) {
	c := s.codes()
	c.mu.RLock()
	code, ok := c.byType[typ]
	c.mu.RUnlock()
	if ok {
		return code, true, nil
	}
	code, err := s.c.Do(ctx, s.c.B().Hget().Key(s.k.TypeCodes()).Field(typ).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("shard: type code of %q: %w", typ, err)
	}
	return code, true, nil
}

// typeDevicesScript lists the devices of one registry partition whose
// entry is a type code.
//
// KEYS: the registry HASHes of one partition
// ARGV[1]: the type code
// Returns: the ids of the devices of that type.
var typeDevicesScript = NewScript(`
local out = {}
for _, k in ipairs(KEYS) do
  local all = redis.call('HGETALL', k)
  for j = 1, #all, 2 do
    if all[j + 1] == ARGV[1] then out[#out + 1] = all[j] end
  end
end
return out`)

// devicesOfType returns the devices of registry partitions [from, to)
// registered with type code code, in one round trip.
func (s *Store) devicesOfType(ctx context.Context, code string, from, to int) ([]string, error) {
	execs := make([]rueidis.LuaExec, 0, to-from)
	for p := from; p < to; p++ {
		keys := make([]string, registrySubs)
		for j := range keys {
			keys[j] = s.k.partKeyAt(p, "reg:"+strconv.Itoa(j))
		}
		execs = append(execs, rueidis.LuaExec{Keys: keys, Args: []string{code}})
	}
	var ids []string
	for _, r := range typeDevicesScript.execMulti(ctx, s.c, execs...) {
		got, err := r.AsStrSlice()
		if err != nil {
			return nil, fmt.Errorf("shard: list devices of a type: %w", err)
		}
		ids = append(ids, got...)
	}
	return ids, nil
}

// shiftTypeScript moves the deadlines of a batch of devices in one shard
// by the change of their type's threshold, each as shiftScript moves one:
// against its score, an absent device left absent, a deadline at or before
// the horizon left alone, a lowered one never closer than the new
// threshold from now. Fenced by topology.
//
// KEYS[1]: deadline ZSET of one shard
// KEYS[2]: layout HASH of the shard
// KEYS[3]: wake key of the shard: a lowered deadline may be its new head
// ARGV[1]: epoch of the caller's topology; ARGV[2]: its shard count
// ARGV[3]: new threshold - old threshold, ms; ARGV[4]: horizon, unix ms
// ARGV[5]: new threshold, ms; ARGV[6..]: device ids
// Returns: how many deadlines moved, or the error STALE.
var shiftTypeScript = NewScript(wakeLua + fenceLua + `
local delta, horizon, thr = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local moved, earliest = 0, nil
for j = 6, #ARGV do
  local cur = redis.call('ZSCORE', KEYS[1], ARGV[j])
  if cur then
    cur = tonumber(cur)
    if cur > horizon then
      local next = cur + delta
      if delta < 0 then next = math.max(next, math.min(cur, horizon + thr)) end
      if not earliest or next < earliest then earliest = next end
      redis.call('ZADD', KEYS[1], 'XX', string.format('%d', next), ARGV[j])
      moved = moved + 1
    end
  end
end
wake(KEYS[3], earliest)
return moved`)

// shiftMany runs shiftTypeScript over ids in every shard that may hold
// each under the topology in force, in one round trip, and again, as
// onShards does, on the shards a stale topology missed: a batch refused
// with ErrStaleTopology is tried again under the topology read anew, and
// no device is moved twice in one shard.
func (d *Devices) shiftMany(ctx context.Context, ids []string, args []string) (int, error) {
	type batch struct {
		shard int
		ids   []string
	}
	moved := 0
	done := map[string][]int{} // the shards already done of a device tried again
	t := d.topo.Current()
	for attempt := 0; len(ids) > 0; attempt++ {
		byShard := map[int][]string{}
		for _, id := range ids {
			for _, i := range t.Locate(id) {
				if !slices.Contains(done[id], i) {
					byShard[i] = append(byShard[i], id)
				}
			}
		}
		var batches []batch
		var execs []rueidis.LuaExec
		for i, l := range byShard {
			for c := range slices.Chunk(l, typeBatch) {
				batches = append(batches, batch{i, c})
				a := append([]string{strconv.FormatInt(t.Epoch, 10), strconv.Itoa(t.Shards)}, args...)
				execs = append(execs, rueidis.LuaExec{Keys: []string{d.store.k.Timers(Deadlines, i), d.store.k.Layout(i),
					d.store.k.Wake(Deadlines, i)}, Args: append(a, c...)})
			}
		}
		again := map[string]bool{}
		ok := make([]bool, len(batches))
		for j, r := range shiftTypeScript.execMulti(ctx, d.store.c, execs...) {
			n, err := r.AsInt64()
			switch {
			case errors.Is(err, ErrStaleTopology):
				for _, id := range batches[j].ids {
					again[id] = true
				}
			case err != nil:
				return moved, fmt.Errorf("shard: move deadlines of a type in shard %d: %w", batches[j].shard, err)
			default:
				moved += int(n)
				ok[j] = true
			}
		}
		if len(again) == 0 {
			return moved, nil
		}
		for j, b := range batches {
			for _, id := range b.ids {
				if ok[j] && again[id] {
					done[id] = append(done[id], b.shard)
				}
			}
		}
		ids = ids[:0]
		for id := range again {
			ids = append(ids, id)
		}
		if attempt >= staleRetries {
			return moved, fmt.Errorf("%w (epoch %d): no newer topology to place it under; see `sigwatch shards status`", ErrStaleTopology, t.Epoch)
		}
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return moved, ctx.Err()
			case <-time.After(staleWait):
			}
		}
		nt, err := d.topo.Refresh(ctx)
		if err != nil {
			return moved, err
		}
		t = nt
	}
	return moved, nil
}

// A type's change holds its lock for typeLockTTL at a time, renewed while
// the change goes on (a large fleet takes a while to move); a caller waits
// at most typeLockWait for another holder.
const (
	typeLockTTL  = 5 * time.Second
	typeLockWait = 30 * time.Second
)

// keepLockScript extends a lock only if the caller still holds it.
//
// KEYS[1]: the lock STRING
// ARGV[1]: the caller's token; ARGV[2]: the new TTL, ms
// Returns: 1 if extended, 0 if the lock had expired or moved on.
var keepLockScript = NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0`)

// lockType takes typ's lock, waiting for another holder, keeps it while
// held, and returns its release. lost (nil: none) is called once if the
// lock may have lapsed while held: it could not be renewed in time.
func (d *Devices) lockType(ctx context.Context, typ string, lost func()) (func(), error) {
	key, token := d.store.k.TypeLock(typ), rand.Text()
	if err := d.store.acquire(ctx, key, token, typeLockTTL, typeLockWait, fmt.Sprintf("the thresholds of type %q", typ)); err != nil {
		return nil, err
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	// The renewal is owned by the lock: the release stops it and waits.
	go func() {
		defer close(stopped)
		tick := time.NewTicker(typeLockTTL / 5)
		defer tick.Stop()
		kept := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				at := time.Now()
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				n, err := keepLockScript.exec(rctx, d.store.c, []string{key}, []string{token, strconv.FormatInt(typeLockTTL.Milliseconds(), 10)}).AsInt64()
				cancel()
				if err == nil && n == 1 {
					kept = at
				}
				if lost != nil && (err == nil && n == 0 || time.Since(kept) > typeLockTTL*3/5) {
					lost()
					lost = nil
				}
			}
		}
	}()
	return func() {
		close(stop)
		<-stopped
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = unlockScript.exec(rctx, d.store.c, []string{key}, []string{token}).Error()
	}, nil
}

// Type returns what is in force for type typ, read anew.
func (d *Devices) Type(ctx context.Context, typ string) (TypeView, error) {
	if err := d.thr.Reload(ctx); err != nil {
		return TypeView{Type: typ}, err
	}
	return d.thr.Type(typ), nil
}

// Types returns what is in force for every type with a setting, read anew.
func (d *Devices) Types(ctx context.Context) ([]TypeView, error) {
	if err := d.thr.Reload(ctx); err != nil {
		return nil, err
	}
	return d.thr.Types(), nil
}
