// Package guard makes Redis losing data an outage, not amnesia (docs/guarantees.md,
// guarantee 11). It notices a loss or a rollback — the generation record
// missing or behind, a shard whose Redis process changed, a topology below
// one already seen — holds the process not ready, and has one process
// restore Redis from the durable registry: the topology no lower than any
// seen, every known device watched again with a full threshold from the
// end of the outage, lost devices still lost, alarms where they were.
//
// A generation record missing or behind is a loss. A shard whose Redis
// process changed is only a restart, which may have kept everything. When
// the process that went away fsynced every write before acknowledging it
// (appendonly yes, appendfsync always, learnt while it served) and the one
// now serving the shard is its restart (same address, a master with its
// append-only file, never a replica since it started), nothing acknowledged can be missing: the shards are
// stamped again under the same generation, without a restore. Otherwise
// the restore runs and then judges, from what the registry knew and Redis
// no longer held. Nothing missing is said at info level, with no
// redis_data_loss event; anything missing is an error and the event.
//
// While a loss is open, shards refuse claims and first sightings (see
// shard/generation.go): nothing fires from, and no device is first seen
// in, data that may have been rolled back.
//
// One file per concept:
//
//   - guard.go: Options, New, Ready; Establish and Run: the generation
//     check that detects a loss, and the incident that handles one.
//   - meta.go: the registry's installation record (generation,
//     topologies) and the backfill of an installation from before it.
//   - checkpoint.go: the periodic copy of the lost marks into the
//     registry, and whether Redis holds whole data.
//   - restart.go: how each Redis process persists, and the proof that a
//     restart kept everything acknowledged.
//   - restore.go: the restore of Redis from the durable registry;
//     restore_history.go: the stream's recent losses and recoveries it
//     reads first;
//     restore_alarms.go: its last step, the storms and alarm states put
//     back, and the restore lock kept while it runs.
//   - restore_types.go: the thresholds set per device type at run time,
//     put back before the devices.
//   - timers.go: the restore of the generic timers from their journal.
//   - metrics.go: the guard's metrics.
package guard
