// Package timer is sigwatch's generic resettable timers: keyed timers of
// named queues, with an optional payload, reset many times and fired once
// as an event on sigwatch.timer.<queue>. They run on the engine of package
// shard/queue as the family shard.Timers, in the deadlines' shards, with
// leases of their own.
//
// Their HTTP routes are package api's. What lives where:
//
//   - request.go: a reset as the API and the NATS path take it, and its
//     checks (queue names, ids, after/at, mode, payload, batch bounds).
//   - timer.go: Options, Service (New, Run, Reset, Get, Cancel).
//   - fire.go: the family's queue.Handler (one event per due timer, under
//     the shard's fence; fired marks for the crossing rule), the timers'
//     watermark, and the carrying of moved timers while a doubling drains.
//   - nats.go: the resets of the work-queue stream, stored a batch at a
//     time on dispatch's consumer, which acknowledges a message once its
//     resets are stored.
//   - requests.go: resets as core NATS requests, answered once stored.
//   - journal.go: the journal of the durable queues' timers, written
//     before a reset or cancel is acknowledged, from which the guard
//     restores them when Redis loses data; written again, as Redis holds
//     it, for a timer another write changed meanwhile.
//   - config.go, metrics.go: the timers section and sigwatch_timers_*.
package timer
