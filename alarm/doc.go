// Package alarm keeps an alarm for every lost device: raised when the
// device is lost, repeated at an interval (with optional backoff) while it
// stays silent, resolved when it signals again, is acknowledged, removed,
// or has been repeated enough. An acknowledgement with an end pauses the
// repeats instead, and says so once (acked). A device that keeps going
// lost and coming back is damped into one flapping notification.
//
// Alarm workers consume sigwatch.lost.> and sigwatch.recovered.> from the
// event stream through one durable pull consumer shared by every replica,
// so each event is handled once (and again if a worker dies mid-way). A
// device's alarm state lives in Redis beside its registry entry, and every
// transition is one compare-and-set, so replicas racing on a device make
// one transition and one notification. Notifications are published after
// the transition is stored and cleared from it only once JetStream has
// them; their Nats-Msg-Id (NoteID) is derived from the transition, so
// publishing one again after a crash is dropped by JetStream. Every state
// is kept in the durable registry too, and one that announces a
// notification is written there, acked, before the notification is
// published; storms and their scope alarms likewise, per scope, so that a
// restore after Redis lost data puts back what was announced (durable.go,
// stormrestore.go). Every notification and storm event is fenced in the
// stream: a repeat timer's by its shard's fence, the others by the
// process's lapsing fence, so a replica paused past the de-duplication
// window publishes nothing stale.
//
// Repeat timers are not goroutines: they live in a second instance of the
// sharded delay queue (shard.Keys.Alarm, family shard.Repeats) with its own
// topology and leases, run by a shard/queue engine with the alarm's
// handler (repeat.go). Its claims are bounded by the ingest watermark, so a
// repeat fires only when "has the device signalled again?" can be answered.
//
// Goroutines and their owners: Run owns the repeat timers' engine, the event
// consumer with its handlers, and the gauge counter. On shutdown the
// consumer stops taking events and finishes those in hand, then the
// engine finishes its in-flight batch, then Run returns.
//
// Where things live:
//   - alarm.go: Options, New, Run, and the API's view of an alarm.
//   - config.go: the alarm section of the configuration (policy, ack wait).
//   - state.go: the state machine (raised → repeat … → resolved, flapping)
//     and the Policy; pure functions of the state and the time. wake.go:
//     what a timer's wake does to a state.
//   - consume.go: the handler of lost and recovered events (the consumer
//     itself is dispatch's).
//   - repeat.go: the repeat timers' handler of the shard/queue engine.
//   - store.go, notify.go: the states in Redis, the one compare-and-set
//     script, transitions and their notifications; mute.go: acks and mutes
//     and their HASH; metrics.go: gauges and counts (held alarms by the
//     storm that holds them).
//   - storm.go: group and fleet storms, their state and config, the storm
//     hold of new device alarms, the API's view; stormrun.go: counting
//     losses and recoveries into transitions, carried out with the scope
//     alarm; stormstore.go: the scopes' lost sets (StormDevices lists
//     one), states and index, their live counts, and the held alarms by
//     storm as last counted;
//     stormrestore.go: the storms put back from the durable registry after
//     Redis lost data.
//   - durable.go: the alarm and storm states in the durable registry,
//     written before their notifications are published, and the paces
//     moved past the send slots a restore puts back.
//   - fences.go: the lapsing fences of the notifications of events and of
//     the API, and the seam that pauses them in tests.
//   - rate.go: alarm.rate and alarm.rate_total, send slots reserved in
//     Redis (one script) before a notification is published.
//   - index.go: the open-alarm index, built once and kept by every
//     transition; list.go: the open alarms, paged.
//
// Alarm's data lives in Redis under keys named by shard.Keys from shard's
// table of leaves, and is reached only through shard's kit (shard.Script,
// Exec, Do).
package alarm
