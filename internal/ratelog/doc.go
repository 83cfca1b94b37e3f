// Package ratelog is sigwatch's one rate limit on log lines: a line about
// a key goes out at most once per period and says how many it held back,
// so an outage of Redis, NATS or the broker does not flood the log.
//
// Files:
//
//   - ratelog.go: Limiter: one line per key and period.
//   - handler.go: Handler, the process's log: one warning or error line
//     per message and period, one per period for a dependency's outage.
package ratelog
