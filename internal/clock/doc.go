// Package clock gives every sigwatch process the same time base: the
// server time of Redis (docs/guarantees.md, guarantee 8).
//
// Deadlines are stamped by one host and compared with "now" by another:
// an ingest member stamps a signal, a scanner on another host decides it is
// due, another member's probe moves the watermark, an API host stamps a
// posted signal or a mute. Hosts' clocks disagree; if each used its own, a
// host running behind would stamp deadlines that another host fires early.
// So no process decides with its own wall clock: a Clock reads the local
// monotonic clock plus an offset to Redis server time, estimated from TIME
// round trips (the sample with the smallest round trip wins; its error is
// at most half that round trip) and refreshed periodically. Two processes
// then disagree by their two estimates' errors plus the drift of their
// monotonic clocks between refreshes, not by their hosts' skew.
//
// Until the first Sync, Now reads the local clock; a process syncs before
// anything decides on it. From then on Now never goes backwards within a
// process: when a refresh lowers the offset, Now holds still until the
// local clock catches up.
//
// Files:
//
//   - clock.go: Config, Options, Clock: the offset to Redis time, Sync, Run,
//     Now.
//   - metrics.go: sigwatch_clock_*: the offset and its uncertainty.
package clock
