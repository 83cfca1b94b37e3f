// Package scanner fires expired deadlines as lost events. It is the policy
// of the deadline family run by the timer engine of package shard/queue:
// the engine owns leases, the per-shard loop (claim → crossing rule → fire
// → settle → revive), the drain of a doubling and the watermark horizon;
// this package decides what firing a deadline means.
//
// What lives where:
//
//   - scanner.go: Options, Scanner, New (an engine for shard.Deadlines with
//     the lost-event handler), Owned and Run.
//   - lost.go: the handler: the outage rule (invariant 6), the registry's
//     lost marks (written before publishing, undone when not published;
//     what the crossing rule asks through Fired), publishing lost events
//     under the shard's fence (invariant 11), and the recovered event for a
//     fired deadline a reset revived between claim and settle.
//   - metrics.go: the lost-event metrics (lost, publish errors, fire lag);
//     the engine's own metrics are shard/queue's.
//
// Goroutines and their owners: Run runs the engine and returns when it has
// stopped (see shard/queue); the handler starts no goroutine.
package scanner
