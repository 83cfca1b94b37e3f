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
	ErrDraining = errors.New("shard: a doubling is still draining")
	// ErrTopologyChanged is returned by Double when the topology moved
	// between reading it and publishing the doubling.
	ErrTopologyChanged = errors.New("shard: the topology changed")
	// ErrTooManyShards is returned by Double when doubling would exceed
	// MaxShards.
	ErrTooManyShards = errors.New("shard: too many shards")
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
	rerr, ok := rueidis.IsRedisErr(err)
	if !ok {
		return err
	}
	code, _, _ := strings.Cut(rerr.Error(), " ")
	if typed, ok := scriptErrors[code]; ok {
		return typed
	}
	return err
}

// script is a Lua script. It runs by EVALSHA and falls back to EVAL when
// Redis does not have it (a restarted or flushed Redis), and every error it
// returns has been through scriptErr. Every script of the package is one of
// these, declared directly above the one method that runs it.
type script struct {
	lua      *rueidis.Lua
	src, sha string
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{lua: rueidis.NewLuaScript(src), src: src, sha: hex.EncodeToString(sum[:])}
}

// exec runs the script once.
func (s *script) exec(ctx context.Context, c rueidis.Client, keys, args []string) reply {
	return replyOf(s.lua.Exec(ctx, c, keys, args))
}

// reply is the outcome of one run of a script, read like a rueidis result;
// its error has been through scriptErr. A nil reply reads as an error for
// which rueidis.IsRedisNil holds.
type reply struct {
	msg rueidis.RedisMessage
	err error
}

func replyOf(r rueidis.RedisResult) reply {
	v, err := r.ToMessage()
	return reply{msg: v, err: scriptErr(err)}
}

// Error returns the reply's error, nil on success.
func (r reply) Error() error { return r.err }

func (r reply) AsInt64() (int64, error) {
	if r.err != nil {
		return 0, r.err
	}
	return r.msg.AsInt64()
}

func (r reply) ToString() (string, error) {
	if r.err != nil {
		return "", r.err
	}
	return r.msg.ToString()
}

func (r reply) ToArray() ([]rueidis.RedisMessage, error) {
	if r.err != nil {
		return nil, r.err
	}
	return r.msg.ToArray()
}

// Tuple is ToArray for a script that replies with exactly n values: any
// other length is an error.
func (r reply) Tuple(n int) ([]rueidis.RedisMessage, error) {
	v, err := r.ToArray()
	if err == nil && len(v) != n {
		return nil, errors.New("unexpected reply")
	}
	return v, err
}

func (r reply) AsStrSlice() ([]string, error) {
	if r.err != nil {
		return nil, r.err
	}
	return r.msg.AsStrSlice()
}

// execMulti runs the script once per exec, all in one round trip (two when
// Redis does not have the script yet). Replies are in the order of execs.
// rueidis's Lua.ExecMulti loads the script (SCRIPT LOAD) before every batch,
// one more sequential round trip per call; execMulti sends EVALSHA at once
// and falls back to EVAL only for the calls that found the script missing.
func (s *script) execMulti(ctx context.Context, c rueidis.Client, execs ...rueidis.LuaExec) []reply {
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
	out := make([]reply, len(rs))
	for j, r := range rs {
		out[j] = replyOf(r)
	}
	return out
}
