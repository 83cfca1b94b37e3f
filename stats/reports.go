package stats

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// Every sigwatch process reports what it counted over its last minute every
// second or so, one field per process in the reports HASH, so that any
// process serving the API can show fleet-wide numbers whatever roles run
// where. A report carries the time it was made (Redis time, the one clock);
// one older than the reader's maxAge is a process that stopped, and
// whoever writes or reads the HASH next deletes it. The whole HASH expires
// when nobody reports any more.

// reportsLeaf names the reports HASH (process -> "at:body"), in {meta}.
const reportsLeaf = "reports"

// Report is one process's report, as stored.
type Report struct {
	At   int64 // when it was made, unix ms
	Body string
}

// Reports are the processes' reports of one installation.
type Reports struct{ store *shard.Store }

// NewReports returns the reports kept in store.
func NewReports(store *shard.Store) Reports { return Reports{store} }

func (r Reports) key() string { return r.store.Keys().Meta(reportsLeaf) }

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
var reportScript = shard.NewScript(pruneReports + `
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local kept = prune(KEYS[1], tonumber(ARGV[3]))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return #kept / 2`)

// Put stores process's report rep, and deletes the reports older than
// maxAge. The HASH lives on for maxAge after the last report.
func (r Reports) Put(ctx context.Context, process string, rep Report, maxAge time.Duration) error {
	err := r.store.Exec(ctx, reportScript, []string{r.key()}, []string{process,
		strconv.FormatInt(rep.At, 10) + ":" + rep.Body, strconv.FormatInt(rep.At-maxAge.Milliseconds(), 10),
		strconv.FormatInt(maxAge.Milliseconds(), 10)}).Error()
	if err != nil {
		return fmt.Errorf("stats: report of %s: %w", process, err)
	}
	return nil
}

// Delete deletes process's report: a process that stops on purpose drops
// out at once.
func (r Reports) Delete(ctx context.Context, process string) error {
	if err := r.store.Do(ctx, "HDEL", []string{r.key()}, process).Error(); err != nil {
		return fmt.Errorf("stats: delete report of %s: %w", process, err)
	}
	return nil
}

// readScript returns the reports made at or after cutoff and deletes the
// others.
//
// KEYS[1]: reports HASH (process -> "at:body")
// ARGV[1]: cutoff, unix ms
// Returns: the reports kept, flat process, "at:body", ...
var readScript = shard.NewScript(pruneReports + `
return prune(KEYS[1], tonumber(ARGV[1]))`)

// Fresh returns the reports no older than maxAge at now, by process, and
// deletes the older ones.
func (r Reports) Fresh(ctx context.Context, now time.Time, maxAge time.Duration) (map[string]Report, error) {
	v, err := r.store.Exec(ctx, readScript, []string{r.key()},
		[]string{strconv.FormatInt(now.Add(-maxAge).UnixMilli(), 10)}).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("stats: read reports: %w", err)
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
