// Package ratelog is sigwatch's one rate limit on log lines: a line about
// a key goes out at most once per period and says how many it held back,
// so an outage of Redis, NATS or the broker does not flood the log.
//
// Files:
//
//   - ratelog.go: Limiter: one line per key and period.
package ratelog
