// Package dispatch is sigwatch's only door to NATS. It turns decisions into
// messages and hands events to the roles that consume them. Each event
// knows its subject and its de-duplication id (Encode).
//
//   - config.go: the nats section (connection, credentials, TLS, stream
//     shape), its defaults and rules, and Connect.
//   - event.go: the event bodies, subjects and de-duplication ids of the
//     public contract (a device id never enters a subject).
//   - publisher.go: the JetStream stream set-up (created, or brought in
//     line with the configured limits at every start) and asynchronous
//     publishing with bounded outstanding acknowledgements; core NATS as an
//     option.
//   - inflight.go: the room among the asynchronous publishes in flight,
//     which a batch waits for instead of failing (shared with the
//     registry's writes).
//   - atomic.go: a shard's fenced events as one JetStream atomic batch on
//     a replicated stream, message by message for what it cannot settle.
//   - fast.go: a shard's fenced events as one JetStream fast batch on a
//     single-server stream, message by message for what it did not store.
//   - fence.go: shard fences in the stream (invariant 11): an owner's
//     fence message, publishes the stream stores only under the latest
//     fence, and the look-up of events an earlier owner stored. A
//     replicated stream checks one fence of a subject at a time: what it
//     refuses as busy is no fence and goes out again.
//   - lapse.go: lapsing fences for work no shard owns: fence messages the
//     stream removes after half the de-duplication window (Nats-TTL), so
//     that what a paused process still holds is refused once it is gone;
//     renewed on fresh subjects, spread over lanes.
//   - types.go: the bound on device types that get a subject token of
//     their own (nats.max_types).
//   - registry.go: the durable device registry (invariant 10), a KV bucket
//     beside the stream keyed by a hash of the device id, and the
//     installation record.
//   - registry_write.go: first sightings in one asynchronous publish each,
//     changes written in the background (Later, Run), and the stream's
//     losses a restore reads (Losses).
//   - registry_storm.go: the storm records of the registry (a storm's
//     state and its scope alarm's, by a hash of the scope).
//   - registry_types.go: the thresholds set at run time per device type
//     (by a hash of the type).
//   - timers.go: the timer event, the work-queue stream of resets and its
//     durable consumer, and the reset requests (ServeTimerResets), taken
//     in batches.
//   - timerjournal.go: the generic timers' journal (a stream keeping the
//     latest state of each timer, keyed by a hash of queue and id, written
//     in fast batches, several in flight), and the timer events a restore
//     reads.
//   - batches.go: the consumer of timer resets (ConsumeTimerResets): pulled
//     in batches, several at once, acknowledged once handled.
//   - version.go: the oldest nats-server the JetStream mode works with,
//     checked by Dial.
//   - advisories.go: the MQTT listener's client advisories, followed by a
//     system account user of their own (nats.advisories; DialAdvisories,
//     Run), one client's in order.
//   - consume.go: a durable consumer of lost and recovered events shared by
//     the replicas of a role (the alarm workers); sinkconsume.go: a sink's
//     durable consumer of alarm notifications and storm events, one at a
//     time, and its dead letters (sigwatch.sink.failed.<sink>).
//   - audit.go: the audit trail's subject (sigwatch.audit), its record
//     and its publish, bounded in time.
//   - follow.go: an ordered consumer that follows the stream's events by
//     kind and device, from now, a time, the last N or a sequence
//     (GET /v1/events).
package dispatch
