package shard

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Every sigwatch process reports what it counted over its last minute every
// second or so, one field per process in the Reports HASH, so that any
// process serving the API can show fleet-wide numbers whatever roles run
// where. A report carries the time it was made (Redis time, the one clock);
// one older than the reader's maxAge is a process that stopped, and
// whoever writes or reads the HASH next deletes it. The whole HASH expires
// when nobody reports any more.

// Report is one process's report. Body is opaque to the store.
type Report struct {
	At   int64 // when it was made, unix ms
	Body string
}

// pruneReports is the Lua that deletes from the reports HASH at key every
// report made before cutoff (unix ms) or not parsing as "at:body".
const pruneReports = `
local function prune(key, cutoff)
  local all = redis.call('HGETALL', key)
  local kept = {}
  for i = 1, #all, 2 do
    local at = tonumber(string.match(all[i+1], '^(%d+):'))
    if at == nil or at < cutoff then
      redis.call('HDEL', key, all[i])
    else
      kept[#kept+1] = all[i]
      kept[#kept+1] = all[i+1]
    end
  end
  return kept
end
`

// reportScript stores one process's report, drops the stale ones and keeps
// the HASH for ttl.
//
// KEYS[1]: reports HASH (process -> "at:body")
// ARGV[1]: process; ARGV[2]: "at:body"; ARGV[3]: cutoff, unix ms;
// ARGV[4]: ttl, ms
// Returns: the number of reports kept.
var reportScript = NewScript(pruneReports + `
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local kept = prune(KEYS[1], tonumber(ARGV[3]))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return #kept / 2`)

// Report stores process's report r made at now, and deletes the reports
// older than maxAge. The HASH lives on for maxAge after the last report.
func (s *Store) Report(ctx context.Context, process string, r Report, maxAge time.Duration) error {
	err := reportScript.exec(ctx, s.c, []string{s.k.Reports()}, []string{process,
		strconv.FormatInt(r.At, 10) + ":" + r.Body, strconv.FormatInt(r.At-maxAge.Milliseconds(), 10),
		strconv.FormatInt(maxAge.Milliseconds(), 10)}).Error()
	if err != nil {
		return fmt.Errorf("shard: report of %s: %w", process, err)
	}
	return nil
}

// Unreport deletes process's report: a process that stops on purpose drops
// out at once.
func (s *Store) Unreport(ctx context.Context, process string) error {
	return s.hashDelete(ctx, s.k.Reports(), process, "delete report of "+process)
}

// reportsScript returns the reports made at or after cutoff and deletes the
// others.
//
// KEYS[1]: reports HASH (process -> "at:body")
// ARGV[1]: cutoff, unix ms
// Returns: the reports kept, flat process, "at:body", ...
var reportsScript = NewScript(pruneReports + `
return prune(KEYS[1], tonumber(ARGV[1]))`)

// Reports returns the reports no older than maxAge at now, by process, and
// deletes the older ones.
func (s *Store) Reports(ctx context.Context, now time.Time, maxAge time.Duration) (map[string]Report, error) {
	v, err := reportsScript.exec(ctx, s.c, []string{s.k.Reports()},
		[]string{strconv.FormatInt(now.Add(-maxAge).UnixMilli(), 10)}).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("shard: read reports: %w", err)
	}
	out := make(map[string]Report, len(v)/2)
	for j := 0; j+1 < len(v); j += 2 {
		at, body, _ := strings.Cut(v[j+1], ":")
		ms, err := strconv.ParseInt(at, 10, 64)
		if err != nil {
			continue
		}
		out[v[j]] = Report{At: ms, Body: body}
	}
	return out, nil
}

// Fleet counts the watched devices (members of the deadline ZSETs of the n
// shards) and the lost ones (lost marks of every registry partition) in
// one round trip: ZCARD and HLEN are O(1) each, whatever the fleet's size.
// During a doubling n is the new count, which takes in the old shards; a
// moved device counts twice while a stale copy of it waits in its old
// shard, so watched may then exceed the truth by up to the moved devices
// the drain reports.
func (s *Store) Fleet(ctx context.Context, n int) (watched, lost int64, err error) {
	if err := ValidCount(n); err != nil {
		return 0, 0, fmt.Errorf("shard: count fleet: %w", err)
	}
	b := s.c.B()
	cmds := make(rueidis.Commands, 0, n+registryParts)
	for i := range n {
		cmds = append(cmds, b.Zcard().Key(s.k.Timers(Deadlines, i)).Build())
	}
	for p := range registryParts {
		cmds = append(cmds, b.Hlen().Key(s.k.partKeyAt(p, "lost")).Build())
	}
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		c, err := r.AsInt64()
		if err != nil {
			return 0, 0, fmt.Errorf("shard: count fleet: %w", err)
		}
		if j < n {
			watched += c
		} else {
			lost += c
		}
	}
	return watched, lost, nil
}
