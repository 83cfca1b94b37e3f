// Package stats is the fleet's statistics. Every process reports what its
// own metrics counted over its last minute (signals, losses, recoveries,
// fire-lag histograms, alarm counts, a lost broker) into Redis every
// second; a process with the api role sums the fresh reports, adds what
// Redis knows (watched and lost devices, the watermark and its outages,
// the topology and its drain) and keeps a minute of history.
//
// It is a role: it uses shard and internal packages, never another role.
//
// What lives where:
//
//   - stats.go: Options, Fleet (New, Run), the report loop and a report's
//     body.
//   - sample.go: the metrics a report reads, Counts, a sample of them.
//   - merge.go: summing the fresh reports; fire-lag quantiles from merged
//     histogram buckets.
//   - view.go: View (GET /v1/stats), its computation and cache, the history.
//   - reports.go: Reports, each process's report in one HASH, stale ones
//     pruned by whoever writes or reads next.
//   - drain.go: Drain, the progress of a doubling (DrainOf).
package stats
