package shard

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/redis/rueidis"
)

// The errors scripts refuse with. Each is the translation of one error code
// a script replies with (see scriptErr); callers check them with errors.Is.
var (
	// ErrNotOwner is returned by fenced operations when the caller's lease
	// on a shard has expired or moved to another owner. Nothing was changed.
	ErrNotOwner = errors.New("shard: lease not held")
	// ErrStaleTopology is returned when a shard refused a write placed
	// under an old topology (and, by Writer.Upsert, when no newer topology
	// could be read to place it again).
	ErrStaleTopology = errors.New("shard: write refused: placed under an old topology")
	// ErrDraining is returned by Double while the previous doubling drains.
	ErrDraining = errors.New("a doubling is still draining")
	// ErrTopologyChanged is returned by Double when the topology moved
	// between reading it and publishing the doubling.
	ErrTopologyChanged = errors.New("the topology changed")
	// ErrTooManyShards is returned by Double when doubling would exceed
	// MaxShards.
	ErrTooManyShards = errors.New("too many shards")
	// ErrDataLoss is returned when a shard's generation is missing or not
	// the caller's, or the Redis process serving it changed since it was
	// vetted: Redis may have lost or rolled back data (see generation.go).
	ErrDataLoss = errors.New("shard: Redis may have lost data: shard not vetted under this generation")
)

// scriptErrors maps the code a script's error reply starts with to the
// error it means.
var scriptErrors = map[string]error{
	"NOTOWNER": ErrNotOwner,
	"STALE":    ErrStaleTopology,
	"DRAINING": ErrDraining,
	"CHANGED":  ErrTopologyChanged,
	"TOOMANY":  ErrTooManyShards,
	"LOSTDATA": ErrDataLoss,
}

// scriptErr is the one place script error replies are recognised: a reply
// whose first word is a known code becomes its typed error; anything else
// (a connection error, redis nil, an unknown reply) is returned unchanged.
func scriptErr(err error) error {
	if typed, ok := scriptErrors[ErrCode(err)]; ok {
		return typed
	}
	return err
}

// Script is a Lua script. It runs by EVALSHA and falls back to EVAL when
// Redis does not have it (a restarted or flushed Redis), and every error it
// returns has been through the mapper of script errors. Every script is one
// of these, a package-level value declared directly above the one method
// that runs it, in the package that owns the data it touches.
type Script struct {
	lua      *rueidis.Lua
	src, sha string
}

// NewScript returns the script of Lua source src.
func NewScript(src string) *Script {
	sum := sha1.Sum([]byte(src))
	return &Script{lua: rueidis.NewLuaScript(src), src: src, sha: hex.EncodeToString(sum[:])}
}

// exec runs the script once.
func (s *Script) exec(ctx context.Context, c rueidis.Client, keys, args []string) Reply {
	return replyOf(s.lua.Exec(ctx, c, keys, args))
}

// Reply is the outcome of one command or script run. Its error has been
// through the mapper of script errors; a nil reply reads as an error for
// which IsNil holds.
type Reply struct {
	msg rueidis.RedisMessage
	err error
}

func replyOf(r rueidis.RedisResult) Reply {
	v, err := r.ToMessage()
	return Reply{msg: v, err: scriptErr(err)}
}

// Error returns the reply's error, nil on success.
func (r Reply) Error() error { return r.err }

// IsNil reports whether the reply is Redis's nil (a missing key or field).
func (r Reply) IsNil() bool { return rueidis.IsRedisNil(r.err) }

// AsInt64 reads an integer reply, or a string holding one.
func (r Reply) AsInt64() (int64, error) {
	if r.err != nil {
		return 0, r.err
	}
	return r.msg.AsInt64()
}

// AsFloat64 reads a float reply, or a string holding one.
func (r Reply) AsFloat64() (float64, error) {
	if r.err != nil {
		return 0, r.err
	}
	return r.msg.AsFloat64()
}

// ToString reads a string reply.
func (r Reply) ToString() (string, error) {
	if r.err != nil {
		return "", r.err
	}
	return r.msg.ToString()
}

// AsStrSlice reads an array of strings.
func (r Reply) AsStrSlice() ([]string, error) {
	if r.err != nil {
		return nil, r.err
	}
	return r.msg.AsStrSlice()
}

// AsStrMap reads a map reply (HGETALL), or a flat array of field, value.
func (r Reply) AsStrMap() (map[string]string, error) {
	if r.err != nil {
		return nil, r.err
	}
	return r.msg.AsStrMap()
}

// Array reads an array reply as its elements.
func (r Reply) Array() ([]Reply, error) {
	v, err := r.messages()
	if err != nil {
		return nil, err
	}
	out := make([]Reply, len(v))
	for j, m := range v {
		out[j] = Reply{msg: m, err: scriptErr(m.Error())}
	}
	return out, nil
}

func (r Reply) messages() ([]rueidis.RedisMessage, error) {
	if r.err != nil {
		return nil, r.err
	}
	return r.msg.ToArray()
}

// tuple is messages for a script that replies with exactly n values: any
// other length is an error.
func (r Reply) tuple(n int) ([]rueidis.RedisMessage, error) {
	v, err := r.messages()
	if err == nil && len(v) != n {
		return nil, errors.New("unexpected reply")
	}
	return v, err
}

// execMulti runs the script once per exec, all in one round trip (two when
// Redis does not have the script yet). Replies are in the order of execs.
// rueidis's Lua.ExecMulti loads the script (SCRIPT LOAD) before every batch,
// one more sequential round trip per call; execMulti sends EVALSHA at once
// and falls back to EVAL only for the calls that found the script missing.
func (s *Script) execMulti(ctx context.Context, c rueidis.Client, execs ...rueidis.LuaExec) []Reply {
	if len(execs) == 0 {
		return nil
	}
	cmds := make(rueidis.Commands, len(execs))
	for j, e := range execs {
		cmds[j] = c.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build()
	}
	rs := c.DoMulti(ctx, cmds...)
	var again []int
	for j, r := range rs {
		if err, ok := rueidis.IsRedisErr(r.Error()); ok && err.IsNoScript() {
			again = append(again, j)
		}
	}
	if len(again) > 0 {
		cmds = cmds[:0]
		for _, j := range again {
			e := execs[j]
			cmds = append(cmds, c.B().Eval().Script(s.src).Numkeys(int64(len(e.Keys))).Key(e.Keys...).Arg(e.Args...).Build())
		}
		for k, r := range c.DoMulti(ctx, cmds...) {
			rs[again[k]] = r
		}
	}
	out := make([]Reply, len(rs))
	for j, r := range rs {
		out[j] = replyOf(r)
	}
	return out
}

// The kit with which a role keeps data of its own in Redis: its scripts
// (NewScript) run by Exec, its few plain commands by Do, its keys named by
// Keys (see keys.go), every reply read through Reply. No rueidis type
// crosses it.

// Call is one run of a script in an ExecMulti batch.
type Call struct{ Keys, Args []string }

// Exec runs script once with keys and args.
func (s *Store) Exec(ctx context.Context, script *Script, keys, args []string) Reply {
	return script.exec(ctx, s.c, keys, args)
}

// ExecMulti runs script once per call, all in one round trip; replies are
// in the order of calls.
func (s *Store) ExecMulti(ctx context.Context, script *Script, calls ...Call) []Reply {
	execs := make([]rueidis.LuaExec, len(calls))
	for j, c := range calls {
		execs[j] = rueidis.LuaExec{Keys: c.Keys, Args: c.Args}
	}
	return script.execMulti(ctx, s.c, execs...)
}

// Cmd is one plain Redis command: its name, the keys it touches (they
// route it on a Redis Cluster, and come first after the name), then its
// other arguments.
type Cmd struct {
	Name       string
	Keys, Args []string
}

// readOnly lists the commands Do sends as read-only: rueidis retries them
// on a lost connection, as it does the typed read commands.
var readOnly = map[string]bool{"GET": true, "HGET": true, "HGETALL": true, "HLEN": true, "HSCAN": true,
	"ZCARD": true, "ZCOUNT": true, "ZRANGE": true, "ZSCAN": true, "ZSCORE": true, "SCARD": true, "LRANGE": true}

// Do runs one command.
func (s *Store) Do(ctx context.Context, name string, keys []string, args ...string) Reply {
	return s.DoMulti(ctx, Cmd{Name: name, Keys: keys, Args: args})[0]
}

// DoMulti runs cmds in one round trip; replies are in the order of cmds.
func (s *Store) DoMulti(ctx context.Context, cmds ...Cmd) []Reply {
	built := make(rueidis.Commands, len(cmds))
	for j, c := range cmds {
		a := s.c.B().Arbitrary(c.Name).Keys(c.Keys...).Args(c.Args...)
		// Pinned: a retried command must not be recycled while a dead
		// connection's writer may still read it.
		if readOnly[c.Name] {
			built[j] = a.ReadOnly().Pin()
		} else {
			built[j] = a.Build().Pin()
		}
	}
	out := make([]Reply, len(cmds))
	for j, r := range s.c.DoMulti(ctx, built...) {
		out[j] = replyOf(r)
	}
	return out
}

// ErrCode returns the code an error reply of a script starts with ("" for
// any other error): a role maps the codes of its own scripts to its typed
// errors with it.
func ErrCode(err error) string {
	rerr, ok := rueidis.IsRedisErr(err)
	if !ok {
		return ""
	}
	code, _, _ := strings.Cut(rerr.Error(), " ")
	return code
}
