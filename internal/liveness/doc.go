// Package liveness is what GET /healthz answers (api.Options.Stalled):
// whether the process's long-running loops still make progress. The
// scanner and alarm coordinators beat whenever their loop reads the clock,
// every rebalance period (500ms); ingest's flush loops beat at each batch,
// each store attempt and every second while idle. They do so whatever
// Redis, NATS or the broker do, because every call they make to them is
// bounded (see minStale). So a beat older than stale means a loop is stuck in this
// process, and a restart helps; a dependency being down is readiness's
// business (/readyz), and restarting pods for it would only add to the
// outage. Deps is that readiness side: which of Redis and NATS is down.
//
// Files:
//
//   - liveness.go: the beats of the watched loops and which are stalled.
//   - deps.go: Deps, which of Redis and NATS is down, from probes of its
//     own; the API's deadlines and the log's grouping ask it.
package liveness
