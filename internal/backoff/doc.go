// Package backoff is sigwatch's one back-off: exponential waits with
// jitter and a cap, and a wait that gives up when its context ends.
//
// A Policy says how waits grow; Delay gives the wait before a given retry.
// A Backoff counts the failures of one loop so it need not: Next, Reset,
// and Wait, which sleeps the next delay unless the context ends first.
//
// Files:
//
//   - backoff.go: Policy, Delay, Backoff and Wait.
package backoff
