// Package queue is the engine every timer family runs: deadlines (fired by
// package scanner as lost events) and alarm repeats (fired by package
// alarm). A family's policy plugs in as a Handler; the engine owns
// everything else, and in particular the order every invariant rests on.
//
// What lives where:
//
//   - config.go: the scanner section of the configuration (lease time,
//     poll, claim limit), its defaults and rules.
//   - queue.go: Options, the Handler interface, Engine, New, Owned and Run
//     (the coordinator).
//   - lease.go: membership heartbeat, lease acquisition, renewal and
//     release, rebalancing, shutdown.
//   - Options.Fencer: a shard's loop fences the shard (outside Redis)
//     before its first claim, and hands the fence to the handler in every
//     Batch; a handler whose publish is refused under it returns ErrFenced
//     and the loop settles nothing and stops (invariant 11).
//   - loop.go: the per-shard loop and its step, written once: sleep until
//     the head is due (woken at once by an earlier write, see
//     shard.Store.Wakes), claim (fenced) up to the horizon → crossing rule →
//     Handler.Fire → settle (fenced compare-and-remove, moves) →
//     Handler.Revived for a fired entry a reset revived meanwhile.
//   - crossing.go: the crossing rule that checks moved members against their
//     partner shard while a doubling drains.
//   - drain.go: the drain duties of a doubling (floors, counts, finish).
//   - watermark.go: the horizon: claims are bounded by the ingest
//     watermark, read from Options.Watermark.
//   - metrics.go: the engine's metrics (sigwatch_scanner_*, labelled with
//     the family) and its rate-limited warnings.
//
// The engine talks to Redis only through package shard and knows nothing
// of NATS: what a fired timer means is the handler's business.
//
// Goroutines and their owners: Run is the coordinator. It heartbeats
// membership, acquires, renews and releases leases, and starts one shard
// loop per held lease. Run owns every shard loop: it asks a loop to stop
// when its shard is no longer desired or on shutdown (the loop finishes its
// in-flight batch, then releases its lease), cancels it when its lease is
// lost, and does not return before every loop has ended. On shutdown the
// loops stop first, then the replica leaves the membership.
package queue
