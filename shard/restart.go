package shard

import (
	"context"
	"fmt"
	"sort"

	"github.com/redis/rueidis"
)

// A shard stamped with one Redis process and served by another is refused
// (generation.go) because a restart may have rolled it back. A restart
// that cannot have is one of a master that wrote every write to its
// append-only file, and fsynced it, before acknowledging it (appendonly
// yes, appendfsync always): the file holds every acknowledged write, in the
// order Redis ran them, and the restarted process loads it whole. Such a
// shard is stamped again with the new process under the same generation.

// Run is one Redis process the store's client reaches.
type Run struct {
	Addr string
	ID   string // run_id
	// Master is true for a master (a replica serves no shard); Replicated
	// when the process has been a replica since it started (a promoted one
	// holds what replication had brought, not its own file).
	Master, Replicated bool
	// AOF is true when it runs with its append-only file; Durable when,
	// besides, it fsyncs every write before acknowledging it and its last
	// write to the file succeeded.
	AOF, Durable bool
}

// Runs asks every Redis node the client knows which process it runs and
// how it persists.
func (s *Store) Runs(ctx context.Context) ([]Run, error) {
	nodes := s.c.Nodes()
	addrs := make([]string, 0, len(nodes))
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	sort.Strings(addrs)
	runs := make([]Run, 0, len(addrs))
	for _, addr := range addrs {
		c := nodes[addr]
		info, err := c.Do(ctx, c.B().Info().Build()).ToString()
		if err != nil {
			return nil, fmt.Errorf("shard: redis %s: info: %w", addr, err)
		}
		r := Run{Addr: addr, ID: infoField(info, "run_id"), Master: infoField(info, "role") == "master",
			Replicated: infoField(info, "second_repl_offset") != "-1", AOF: infoField(info, "aof_enabled") == "1"}
		if r.AOF && infoField(info, "aof_last_write_status") == "ok" {
			// CONFIG may be renamed away (a managed Redis): the process
			// then counts as not durable, and a restart as a possible loss.
			// A connection that failed (Redis shutting down) says nothing.
			kv, err := c.Do(ctx, c.B().ConfigGet().Parameter("appendfsync").Build()).AsStrMap()
			if _, refused := rueidis.IsRedisErr(err); err != nil && !refused {
				return nil, fmt.Errorf("shard: redis %s: config: %w", addr, err)
			}
			r.Durable = err == nil && kv["appendfsync"] == "always"
		}
		runs = append(runs, r)
	}
	return runs, nil
}

// Restarted is a shard stamped under the store's generation by one Redis
// process and served now by another.
type Restarted struct {
	Shard    int
	Was, Now string // run ids
}

// stampScript returns a shard's stamp and the run id serving it.
//
// KEYS[1]: layout HASH of the shard
// Returns: {gen or "", run or "", serving run}
var stampScript = NewScript(`
local v = redis.call('HMGET', KEYS[1], 'gen', 'run')
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
return {v[1] or '', v[2] or '', run}`)

// Restarts returns the shards among 0..n-1 served by another Redis process
// than the one that stamped them. A shard not stamped under the store's
// generation is ErrDataLoss: that is no restart but a loss, or a restore.
func (s *Store) Restarts(ctx context.Context, n int) ([]Restarted, error) {
	gen := s.Generation()
	execs := make([]rueidis.LuaExec, n)
	for i := range n {
		execs[i] = rueidis.LuaExec{Keys: []string{s.k.Layout(i)}}
	}
	var out []Restarted
	for i, r := range stampScript.execMulti(ctx, s.c, execs...) {
		v, err := r.tuple(3)
		if err != nil {
			return nil, fmt.Errorf("shard: shard %d: %w", i, err)
		}
		g, _ := v[0].ToString()
		was, _ := v[1].ToString()
		now, _ := v[2].ToString()
		if g != gen {
			return nil, fmt.Errorf("shard: shard %d is stamped under generation %q, not %q: %w", i, g, gen, ErrDataLoss)
		}
		if was != now {
			out = append(out, Restarted{Shard: i, Was: was, Now: now})
		}
	}
	return out, nil
}

// restampScript stamps a shard with the Redis process serving it, if its
// stamp and that process are still the ones proven.
//
// KEYS[1]: layout HASH of the shard
// ARGV[1]: generation id; ARGV[2]: run id it was stamped with; ARGV[3]:
// run id proven to serve it whole
// Returns: 1 if stamped, 0 if anything changed since the proof.
var restampScript = NewScript(`
local v = redis.call('HMGET', KEYS[1], 'gen', 'run')
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if v[1] ~= ARGV[1] or v[2] ~= ARGV[2] or run ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'run', run)
return 1`)

// Restamp stamps each restarted shard with the Redis process now serving
// it, under the store's generation, so that it may be claimed again. It
// returns ErrDataLoss if a shard's stamp or serving process changed since
// they were read (another restart, or a restore).
func (s *Store) Restamp(ctx context.Context, rs []Restarted) error {
	gen := s.Generation()
	execs := make([]rueidis.LuaExec, len(rs))
	for i, r := range rs {
		execs[i] = rueidis.LuaExec{Keys: []string{s.k.Layout(r.Shard)}, Args: []string{gen, r.Was, r.Now}}
	}
	for i, r := range restampScript.execMulti(ctx, s.c, execs...) {
		n, err := r.AsInt64()
		if err != nil {
			return fmt.Errorf("shard: restamp shard %d: %w", rs[i].Shard, err)
		}
		if n != 1 {
			return fmt.Errorf("shard: shard %d changed while its restart was checked: %w", rs[i].Shard, ErrDataLoss)
		}
	}
	return nil
}
