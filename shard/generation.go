package shard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Redis may lose data: a restart without persistence, a failover to a
// replica that had not caught up, appendfsync everysec, a FLUSHALL. The
// generation makes such a loss visible instead of silent:
//
//   - The generation record (Keys.Generation) holds the id of the data in
//     force. It is created with an installation and written again after
//     each restore; a process remembers the id it works under.
//   - Every shard's layout carries that id ("gen") and the run id of the
//     Redis process that served the shard when it was last vetted ("run").
//   - A claim compares both inside its script: a shard whose generation is
//     missing or different, or whose Redis process has changed (restarted,
//     or a replica promoted, either of which may have rolled it back), is
//     refused with ErrDataLoss before anything is read from it. A write of
//     absent ids is refused the same way when the generation is missing.
//
// So nothing is fired from, and no device is first seen in, data that may
// have been rolled back, until it is restored and vetted again.

// generation is the generation id a Store works under, shared by the
// stores of every family of one process.
type generation struct {
	id     atomic.Pointer[string]
	onLoss atomic.Pointer[func(error)]
}

// OnDataLoss sets f to be told when a claim or a write is refused with
// ErrDataLoss, by this store or any derived from the same one.
func (s *Store) OnDataLoss(f func(error)) { s.gen.onLoss.Store(&f) }

// lossSeen tells the OnDataLoss function of err if it is ErrDataLoss.
func (s *Store) lossSeen(err error) {
	if s.gen == nil || !errors.Is(err, ErrDataLoss) {
		return
	}
	if f := s.gen.onLoss.Load(); f != nil {
		(*f)(err)
	}
}

// Generation returns the generation id the store works under ("" before
// one is set: nothing is checked).
func (s *Store) Generation() string {
	if s.gen == nil {
		return ""
	}
	if p := s.gen.id.Load(); p != nil {
		return *p
	}
	return ""
}

// SetGeneration makes the store, and every store derived from the same
// one, work under generation id.
func (s *Store) SetGeneration(id string) { s.gen.id.Store(&id) }

// Unchecked returns a view of the store whose scripts check no generation:
// the restore writes through it before the generation exists again.
func (s *Store) Unchecked() *Store { return &Store{c: s.c, k: s.k, types: new(typeCodes)} }

// GenRecord is the generation record: the id of the data in force, a
// sequence every process's beat increments, and the time of the last beat.
type GenRecord struct {
	ID  string
	Seq int64
	At  int64
}

// beatScript increments the generation record's sequence, stamping the
// time; a missing record stays missing.
//
// KEYS[1]: generation record
// ARGV[1]: now, unix ms
// Returns: {id, seq, previous at} or nil when there is no record.
var beatScript = NewScript(`
local id = redis.call('HGET', KEYS[1], 'id')
if not id then return false end
local at = redis.call('HGET', KEYS[1], 'at') or '0'
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], 'at', ARGV[1])
return {id, seq, at}`)

// Beat increments the generation record's sequence and returns the record
// as it was found (Seq is the new sequence, At the previous beat's time);
// ok is false when Redis holds no record.
func (s *Store) Beat(ctx context.Context, now int64) (r GenRecord, ok bool, err error) {
	v, err := beatScript.exec(ctx, s.c, []string{s.k.Generation()}, []string{strconv.FormatInt(now, 10)}).tuple(3)
	if rueidis.IsRedisNil(err) {
		return GenRecord{}, false, nil
	}
	if err != nil {
		return GenRecord{}, false, fmt.Errorf("shard: generation beat: %w", err)
	}
	r.ID, _ = v[0].ToString()
	r.Seq, _ = v[1].AsInt64()
	at, _ := v[2].ToString()
	r.At, _ = strconv.ParseInt(at, 10, 64)
	return r, true, nil
}

// createGenerationScript writes a generation record unless one exists.
//
// KEYS[1]: generation record
// ARGV[1]: id; ARGV[2]: now, unix ms; ARGV[3]: "1" to overwrite
// Returns: the id in force afterwards.
var createGenerationScript = NewScript(`
local id = redis.call('HGET', KEYS[1], 'id')
if id and ARGV[3] ~= '1' then return id end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'seq', 1, 'at', ARGV[2])
return ARGV[1]`)

// CreateGeneration writes the generation record with id unless one
// exists, and returns the id in force.
func (s *Store) CreateGeneration(ctx context.Context, id string, now int64) (string, error) {
	return s.writeGeneration(ctx, id, now, false)
}

// WriteGeneration writes the generation record with id, replacing any.
func (s *Store) WriteGeneration(ctx context.Context, id string, now int64) error {
	_, err := s.writeGeneration(ctx, id, now, true)
	return err
}

func (s *Store) writeGeneration(ctx context.Context, id string, now int64, overwrite bool) (string, error) {
	ow := "0"
	if overwrite {
		ow = "1"
	}
	v, err := createGenerationScript.exec(ctx, s.c, []string{s.k.Generation()},
		[]string{id, strconv.FormatInt(now, 10), ow}).ToString()
	if err != nil {
		return "", fmt.Errorf("shard: write generation: %w", err)
	}
	return v, nil
}

// vetScript stamps a shard's layout with the generation and the run id of
// the Redis process serving it.
//
// KEYS[1]: layout HASH of the shard
// ARGV[1]: generation id
var vetScript = NewScript(`
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'run', run)
return run`)

// Vet stamps shards 0..n-1 of the store with generation id: from then on
// they may be claimed under it.
func (s *Store) Vet(ctx context.Context, n int, id string) error { return s.vet(ctx, 0, n, id) }

// vet stamps shards from..to-1.
func (s *Store) vet(ctx context.Context, from, to int, id string) error {
	execs := make([]rueidis.LuaExec, 0, to-from)
	for i := from; i < to; i++ {
		execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.Layout(i)}, Args: []string{id}})
	}
	for j, r := range vetScript.execMulti(ctx, s.c, execs...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: vet shard %d: %w", from+j, err)
		}
	}
	return nil
}

// vetNew stamps the shards a doubling of n adds with the generation in
// force, if there is one, so they are claimable as soon as they exist.
func (s *Store) vetNew(ctx context.Context, n int) error {
	id, err := s.c.Do(ctx, s.c.B().Hget().Key(s.k.Generation()).Field("id").Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("shard: read generation: %w", err)
	}
	return s.vet(ctx, n, 2*n, id)
}

// Lock names one of the installation's locks.
type Lock int

const (
	// RestoreLock is held by the one process restoring Redis after a loss.
	RestoreLock Lock = iota
	// CheckpointLock is taken by the process that copies the lost marks
	// into the durable registry, for one checkpoint interval.
	CheckpointLock
)

func (s *Store) lockKey(l Lock) string {
	if l == CheckpointLock {
		return s.k.CheckpointLock()
	}
	return s.k.RestoreLock()
}

// TakeLock takes lock l for ttl with token; ok is false when another
// process holds it (took it less than ttl ago).
func (s *Store) TakeLock(ctx context.Context, l Lock, token string, ttl time.Duration) (bool, error) {
	key := s.lockKey(l)
	err := s.c.Do(ctx, s.c.B().Set().Key(key).Value(token).Nx().Px(ttl).Build()).Error()
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("shard: lock %s: %w", key, err)
	}
	return true, nil
}

// extendScript extends a lock still held by the caller.
//
// KEYS[1]: lock; ARGV[1]: token; ARGV[2]: ttl ms
// Returns: 1 if extended, 0 if the lock is not the caller's.
var extendScript = NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`)

// ExtendLock extends lock l held with token to ttl from now; ok is false
// when it is no longer held. A ttl of a millisecond releases it.
func (s *Store) ExtendLock(ctx context.Context, l Lock, token string, ttl time.Duration) (bool, error) {
	n, err := extendScript.exec(ctx, s.c, []string{s.lockKey(l)}, []string{token, strconv.FormatInt(ttl.Milliseconds(), 10)}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("shard: extend lock: %w", err)
	}
	return n == 1, nil
}

// vettedScript checks that a shard is vetted under a generation by the
// Redis process serving it now.
//
// KEYS[1]: layout HASH of the shard; ARGV[1]: generation id
// Returns: 1, or the error LOSTDATA.
var vettedScript = NewScript(`
local v = redis.call('HMGET', KEYS[1], 'gen', 'run')
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if v[1] ~= ARGV[1] or v[2] ~= run then
  return redis.error_reply('LOSTDATA shard not vetted under generation ' .. ARGV[1])
end
return 1`)

// Vetted checks that shards 0..n-1 of the store are vetted under the
// store's generation by the Redis processes serving them now; it returns
// ErrDataLoss for the first that is not.
func (s *Store) Vetted(ctx context.Context, n int) error {
	id := s.Generation()
	execs := make([]rueidis.LuaExec, n)
	for i := range n {
		execs[i] = rueidis.LuaExec{Keys: []string{s.k.Layout(i)}, Args: []string{id}}
	}
	for i, r := range vettedScript.execMulti(ctx, s.c, execs...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: shard %d: %w", i, err)
		}
	}
	return nil
}

// ShareGeneration makes s work under the generation of other (two
// connections of one process).
func (s *Store) ShareGeneration(other *Store) { s.gen, s.types = other.gen, other.types }
