package shard

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// A timer's journal record is written after Redis stored the timer, so two
// writes of one timer racing (two batches, two processes) may reach the
// journal in the other order than Redis took them. The writer compares,
// once its record is stored, the timer in Redis with what it journalled
// (TimersChanged) and journals again what differs: the record last stored
// is then always one whose writer found Redis holding it afterwards.

// checkTimersScript compares timers of one shard with what was journalled
// of them, fenced by timerFence: it reads the copy every write goes to, and
// a shard that lost its data answers LOSTDATA rather than "absent".
//
// KEYS[1]: timer ZSET; KEYS[2]: layout HASH; KEYS[3]: payloads
// ARGV[1..3]: see timerFence
// ARGV[4..]: triples of member, deadline journalled ("0": absent) and the
// SHA-1 of its payload in hex ("": none)
// Returns: per triple that differs, its index (from 0) and the timer as
// Redis holds it: "-" absent, else deadline ":" payload ("" none, "p"..).
var checkTimersScript = NewScript(timerFence + `
local out = {}
for i = 4, #ARGV, 3 do
  local m = ARGV[i]
  local d = redis.call('ZSCORE', KEYS[1], m)
  local p = redis.call('HGET', KEYS[3], m)
  local ok
  if not d then
    ok = ARGV[i+1] == '0'
  else
    ok = tonumber(d) == tonumber(ARGV[i+1]) and ((not p and ARGV[i+2] == '') or (p and redis.sha1hex(p) == ARGV[i+2]))
  end
  if not ok then
    out[#out+1] = tostring((i - 4) / 3)
    if not d then out[#out+1] = '-'
    elseif p then out[#out+1] = string.format('%d', tonumber(d)) .. ':p' .. p
    else out[#out+1] = string.format('%d', tonumber(d)) .. ':' end
  end
end
return out`)

// TimersChanged compares each of want, a timer as journalled (Deadline 0:
// absent), with the timer Redis holds now, and returns those that differ,
// each as Redis holds it (Deadline 0: absent). While a doubling drains it
// carries a moved timer first, as a write does, and reads its new copy.
func (w *Writer) TimersChanged(ctx context.Context, want []Timer) ([]Timer, error) {
	var out []Timer
	err := onTimers(ctx, w, want, func(t Timer) string { return t.Member }, func(t Topology, by map[int][]Timer) ([]int, error) {
		changed, refused, err := w.store.checkTimersAt(ctx, t, by)
		out = append(out, changed...)
		return refused, err
	})
	return out, err
}

// checkTimersAt compares the timers placed in by under t, and returns those
// that differ (as Redis holds them) and the shards that refused.
func (s *Store) checkTimersAt(ctx context.Context, t Topology, by map[int][]Timer) ([]Timer, []int, error) {
	shards := make([]int, 0, len(by))
	execs := make([]rueidis.LuaExec, 0, len(by))
	for i, ts := range by {
		args := append(make([]string, 0, 3+3*len(ts)), strconv.FormatInt(t.Epoch, 10), s.Generation(), strconv.Itoa(t.Shards))
		for _, tm := range ts {
			sum := ""
			if tm.Payload != nil {
				h := sha1.Sum(tm.Payload)
				sum = hex.EncodeToString(h[:])
			}
			args = append(args, tm.Member, strconv.FormatInt(tm.Deadline, 10), sum)
		}
		shards = append(shards, i)
		execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.Timers(Timers, i), s.k.Layout(i), s.k.TimerPayloads(i)}, Args: args})
	}
	replies := checkTimersScript.execMulti(ctx, s.c, execs...)
	var changed []Timer
	for j, r := range replies {
		if r.Error() != nil {
			continue
		}
		outs, err := r.AsStrSlice()
		if err != nil {
			return nil, nil, fmt.Errorf("shard: check timers in shard %d: %w", shards[j], err)
		}
		ts := by[shards[j]]
		for k := 0; k+1 < len(outs); k += 2 {
			n, err := strconv.Atoi(outs[k])
			if err != nil || n < 0 || n >= len(ts) {
				return nil, nil, fmt.Errorf("shard: check timers in shard %d: answer %q", shards[j], outs[k])
			}
			tm := Timer{Member: ts[n].Member}
			if d, p, ok := strings.Cut(outs[k+1], ":"); ok {
				tm.Deadline, _ = strconv.ParseInt(d, 10, 64)
				if strings.HasPrefix(p, "p") {
					tm.Payload = []byte(p[1:])
				}
			}
			changed = append(changed, tm)
		}
	}
	refused, err := s.refusals(replies, shards, "check timers in")
	return changed, refused, err
}
