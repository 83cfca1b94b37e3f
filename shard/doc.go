// Package shard is sigwatch's only door to Redis: where timers live, how an
// id is hashed to one of 2^n shards, the key layout, the topology and its
// doubling, the leases that give each shard one scanner at a time, the
// device registry several roles share, and the small kit (Script, Exec,
// Do, Reply, Keys) with which a role keeps data that it alone reads and
// writes, and its scripts, in its own package. No rueidis type leaves the
// package.
//
// One file per concept:
//
//	shard.go       Of, Hash, counts, Assign, Entry, Family, Store
//	config.go      the redis section of the configuration, the client
//	bounded.go     the client's calls return by their deadline, even
//	               while it reconnects to a hung Redis
//	keys.go        every key name (Keys), registry partitions (Part), the
//	               table of leaf names with the package owning each
//	script.go      the kit: Script, Exec, Do, Reply, and the one mapper of
//	               script errors to ErrNotOwner, ErrStaleTopology, …
//	hash.go        small records kept as the fields of one HASH
//	parts.go       scans of a HASH in every registry partition
//	topology.go    the topology record and its Watcher
//	doubling.go    Double, layouts and floors, the drain and its reports
//	upsert.go      Upsert: pushing deadlines forward; Admit
//	               decides which absent ids may be added
//	family.go      the members of any family's ZSETs: Arm, Set, Score(s),
//	               Remove, Size(s), a shard's head
//	queues.go      the generic timers of named queues (family Timers):
//	               the write fence, resets with payloads; QueueTimers
//	               (Store.Timers): Get, payloads, the payloads of firing
//	               timers, fired marks for the crossing rule
//	queuemoves.go  generic timers across a doubling: writes that carry a
//	               moved timer first, the carry, cancels
//	timerrestore.go the generic timers after a loss: listed, dropped and
//	               written back as their journal says
//	timercheck.go  the generic timers compared with what was journalled of
//	               them, so a write journals again what changed meanwhile
//	claim.go       Claim, Settle (compare-and-remove, compare-and-move)
//	wake.go        the wake rule: a claim that found nothing due records
//	               when its loop looks again, an earlier write wakes it
//	               (Wakes delivers the notices)
//	lease.go       leases (Acquire, RenewAll, Release, Owner) and scanner
//	               membership (Heartbeat, Leave)
//	watermark.go   Watermarks: the ingest watermark, its outages, ingest
//	               members (the notices of its moves are in wake.go)
//	registry.go    device types, sightings, lost marks (Mark, Clear,
//	               Of, All)
//	lostmarks.go   LostMarks (Store.LostMarks); the lost marks of a
//	               scanner's batch: marked before publishing, undone when
//	               not published
//	deadline.go    the rules of a device's deadline (the latest of its
//	               scores) and of a lost mark that counts
//	groups.go      device groups and each group's membership
//	thresholds.go  per-device threshold overrides and Thresholds
//	typesettings.go a type's thresholds set at run time, stored beside
//	               the overrides, and what is in force for a type
//	typeshift.go   SetType: a type's change applied to its watched
//	               devices, found in the registry, moved in batches
//	device.go      one device in every shard that may hold it: Get, and
//	               Remove and SetThreshold fenced by topology
//	declare.go     offline reports lowering deadlines (Lower) and the
//	               records of why a deadline is where it is (reasons)
//	pager.go       paging through SCAN cursors; ListParts
//	list.go        the device listings (watched, lost)
//	status.go      one batched status read of every shard
//	fleet.go       the fleet's watched and lost counts in one round trip
//	writer.go      Writer: placing under a lagging topology, epoch reports
//	ids.go         the id rules and the reserved $sigwatch- space
//	time.go        Redis server time, the one clock
//	version.go     the oldest Redis sigwatch works with, checked at start
//	generation.go  the generation record, vetted shards, ErrDataLoss, the
//	               restore and checkpoint locks
//	restart.go     a Redis restart that kept everything acknowledged:
//	               how each process persists (Runs), the shards a
//	               restart left unvetted, stamping them again
//	restore.go     the writes of a restore after Redis lost data
//	typecodes.go   device types stored as small codes
//	upgrade.go     every device an installation from before the durable
//	               registry knows
//
// Each Lua script is a package-level value directly above the one method
// that runs it, with a header saying what each KEYS[n] and ARGV[n] is and
// what it returns.
package shard
