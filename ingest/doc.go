// Package ingest turns device messages into deadlines. It subscribes to the
// MQTT broker with a persistent session, parses each topic (and, in payload
// mode, the payload's timestamp), groups the resulting deadlines per shard
// and pushes them forward in Redis (ZADD GT), acknowledging each message to
// the broker only once its deadline is stored. A device that was absent from
// its shard is new or back after being lost: only then does ingest do extra
// work (the registry, and a recovered event).
//
// Ingest also keeps the watermark (docs/guarantees.md, guarantee 6): it publishes a
// probe to itself through the broker, and once the probe is back and every
// signal received before it is stored, the time the probe was sent is a time
// up to which ingest is known to have been consuming.
//
// Late is not new (invariant 8): the broker delivers a session's messages in
// order, so a signal received after one of this member's probes reached the
// broker no earlier than that probe was sent. That send time is the
// signal's evidence: its stamp is capped at outage_after past it, and a
// device found absent is admitted (added back, and announced recovered)
// only if the evidence is newer than its lost mark. Probes ride the
// signals' own subscription where they can, and go out on a connection of
// their own so that they never queue behind a backlog's acks.
//
// Input that cannot be used is counted, logged at a limited rate, forwarded
// to the dead-letter subject and acknowledged; it never holds up other
// devices.
//
// # Stages
//
// Ingest is four stages, each its own type with its own input, wired by
// New and run by Run, which stops senders before receivers:
//
//	source ──signals, barriers──▶ pipeline ──barriers, flushes──▶ watermark
//	   └──────refusals──────▶ dead letters
//
// Where each lives:
//
//   - ingest.go: Ingest, New, Run (the wiring and the order of stopping), Signal.
//   - signals.go: Signals, a batch from the API, stamped in order with barriers.
//   - config.go: the mqtt, timestamp and ingest sections of the
//     configuration, their defaults and rules.
//   - options.go: Options (embedding the ingest section), their defaults
//     and rules (QoS 0, 1 or 2).
//   - source.go: the source — run, onMessage, evidence and stamps, the
//     hand-over of a leaving group member.
//   - conn.go: the source's connection — paho's options, (re)subscribing
//     on every connection, joining a shared group's watermark, the
//     connection's notifications (refused, lost, reconnecting).
//   - mqtt5.go: mqtt.protocol 5 — an MQTT 5 client (autopaho) behind the
//     same client interface and options, so the source, probes and breaks
//     run unchanged; mqtt5msg.go: its messages (with their user
//     properties, which declared.go reads) and tokens; pahostore.go: the
//     3.1.1 client's message store, which hands out copies.
//   - probe.go: the watermark probes — their rate (full while a scanner
//     asks, idle otherwise), sending them, and the barriers their return
//     gives the pipeline.
//   - claim.go: the claim of the client id in Redis, one live process per
//     id, taken before connecting, renewed, released at stop.
//   - broker.go: what the broker says of itself in $SYS: its version
//     (vetting its order), its drops, its uptime.
//   - pipeline.go: the pipeline's intake (in-flight bound, enqueue) and the
//     collector that cuts batches per shard.
//   - flush.go: the pipeline's flush — upsert, ack, welcome first-seen and
//     recovered devices.
//   - watermark.go: the watermark — barrier tracker, member reports.
//   - breaks.go: the broker connection's breaks, reported with the
//     watermark as outages, with the reconnect grace after a restart.
//   - answer.go: whether the broker answers the probes, for readiness: a
//     frozen broker is seen before the MQTT keep-alive notices it.
//   - deadletter.go: the dead letters — refusal queue and forwarding.
//   - publish.go: publishing events with retries (recovered, invalid).
//   - parse.go: topic and timestamp rules, InvalidError; ids, types and
//     groups obey the id rules of shard (shard.CheckID).
//   - declared.go: deadlines a device declares itself (ttd, next), bounded
//     by thresholds.max_declared.
//   - status.go: status topics (mqtt.status): online is a signal, offline
//     (a will) an offline report.
//   - lower.go: the flush's offline reports (shard.Devices.Lower) and the
//     records of declared deadlines.
//   - sparkplug.go: Sparkplug B (mqtt.sparkplug): births arm, bdSeq-checked
//     deaths declare a node and its devices lost; the host's STATE.
//   - connections.go: the broker's connection events (mqtt.connections),
//     from MQTT or fed by Connection, ordered by their version.
//   - metrics.go: the metrics.
package ingest
