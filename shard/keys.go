package shard

import (
	"strconv"
	"strings"
)

// registryParts is the fixed number of registry partitions. It is independent
// of the shard count so that a doubling never moves registry entries.
const registryParts = 1024

// Keys builds every Redis key name sigwatch uses. No key is assembled
// anywhere else.
type Keys struct {
	prefix string
	// root is the prefix of the installation's shared records (the
	// generation, the restore and checkpoint locks): the alarm's queue has
	// a prefix of its own but shares them.
	root string
	// lease suffixes the lease, fence and membership keys: a second engine
	// over the same shards (the generic timers) holds leases of its own.
	lease string
}

// NewKeys returns the key layout under prefix (default "sw").
func NewKeys(prefix string) Keys {
	if prefix == "" {
		prefix = "sw"
	}
	return Keys{prefix: prefix, root: prefix}
}

// Prefix returns the configured key prefix.
func (k Keys) Prefix() string { return k.prefix }

// Alarm returns the key layout of the alarm's repeat timers: a second
// sharded delay queue under prefix ":alarm", with its own topology, leases
// and scanners, so that the alarm role scans it independently of the
// deadline scanners.
func (k Keys) Alarm() Keys { return Keys{prefix: k.prefix + ":alarm", root: k.root} }

func (k Keys) shardKey(i int, name string) string {
	return k.prefix + ":{" + strconv.Itoa(i) + "}:" + name
}

// Timers is the ZSET of family f in shard i.
func (k Keys) Timers(f Family, i int) string { return k.shardKey(i, string(f)) }

// Wake is the STRING of family f in shard i holding when the shard's loop,
// asleep, claims next (unix ms): a write that puts a member earlier wakes
// it (see wake.go).
func (k Keys) Wake(f Family, i int) string { return k.shardKey(i, "wake:"+string(f)) }

// WakeChannel is the pub/sub channel of family f's wake notices: the wake
// keys without their hash tag, so that a script derives it from the key.
func (k Keys) WakeChannel(f Family) string { return k.prefix + ":wake:" + string(f) }

// Owner holds the lease of the scanner that owns shard i.
func (k Keys) Owner(i int) string { return k.shardKey(i, "owner"+k.lease) }

// Fence is the counter that hands out fencing tokens for shard i's lease.
func (k Keys) Fence(i int) string { return k.shardKey(i, "fence"+k.lease) }

// TimerPayloads is the HASH of shard i holding the payloads of the generic
// timers that have one (member -> payload). It shares the shard's slot, so
// a timer and its payload change together.
func (k Keys) TimerPayloads(i int) string { return k.shardKey(i, "tp") }

// TimersCarried is the HASH of shard i marking the generic timers carried
// into it by the doubling that drains (member -> 1): a carry writes a
// timer only once (see carryScript).
func (k Keys) TimersCarried(i int) string { return k.shardKey(i, "tc") }

// TimersFiring is the HASH of shard i marking the generic timers whose
// event is being published (member -> deadline), from the read of their
// payloads to the settle (see firingScript).
func (k Keys) TimersFiring(i int) string { return k.shardKey(i, "tx") }

// TimersFired is the HASH of the registry partition of member holding the
// deadline at which a generic timer last fired while a doubling drained
// (member -> unix ms): the crossing rule reads it.
func (k Keys) TimersFired(member string) string { return k.partKey(member, "tf") }

// Layout is the HASH of shard i that fences placement across a doubling:
// "shards" is the largest shard count any writer may place shard i's timers
// under (set for every old shard before a doubling is published, and read
// by every claim), "floor" the epoch below which writes to shard i are
// refused (set when the drain begins to check shard i).
func (k Keys) Layout(i int) string { return k.shardKey(i, "layout") }

func (k Keys) meta(name string) string { return k.prefix + ":{meta}:" + name }

// Topology is the HASH with shards, prev and epoch.
func (k Keys) Topology() string { return k.meta("topology") }

// Generation is the HASH naming the generation of the data in force (id,
// seq, at): see generation.go. One for the installation.
func (k Keys) Generation() string { return k.root + ":{meta}:generation" }

// RestoreLock is held by the process restoring Redis after a loss.
func (k Keys) RestoreLock() string { return k.root + ":{meta}:restore" }

// CheckpointLock is held by the process that last copied the lost marks
// into the durable registry, for one checkpoint interval.
func (k Keys) CheckpointLock() string { return k.root + ":{meta}:checkpoint" }

// Watermark is the time up to which ingest is known to have been consuming.
func (k Keys) Watermark() string { return k.meta("watermark") }

// WatermarkWants is the pub/sub channel on which a scanner that waits for
// a later watermark asks ingest to probe at its full rate (see
// Watermarks.Want).
func (k Keys) WatermarkWants() string { return k.prefix + ":wm:want" }

// WatermarkMoves is the pub/sub channel on which every rise of the
// watermark is announced, with its new value (see Watermarks.Moves).
func (k Keys) WatermarkMoves() string { return k.prefix + ":wm:moved" }

// Outages lists the gaps in the watermark, "start:end" in unix ms.
func (k Keys) Outages() string { return k.meta("outages") }

// Members is the HASH of ingest members' own watermarks.
func (k Keys) Members() string { return k.meta("ingest") }

// Writers is the HASH of ingest writers and the epoch each writes with
// (name -> "epoch:unix ms of the report").
func (k Keys) Writers() string { return k.meta("writers") }

// Drain is the HASH of the drain reports of the old shards while a doubling
// drains (shard -> "epoch:moved:floored:unix ms").
func (k Keys) Drain() string { return k.meta("drain") }

// Scanners is the ZSET of live scanner replicas scored by heartbeat expiry.
func (k Keys) Scanners() string { return k.meta("scanners" + k.lease) }

// Overrides is the HASH of per-device thresholds (id -> ms).
func (k Keys) Overrides() string { return k.meta("overrides") }

// OverridesVersion changes whenever Overrides does, so caches reload cheaply.
func (k Keys) OverridesVersion() string { return k.meta("overrides:v") }

// TypeSettings is the HASH of the thresholds set at run time per device
// type (see typesettings.go); OverridesVersion changes with it too.
func (k Keys) TypeSettings() string { return k.meta("typethr") }

// TypeLock is the STRING that serialises the threshold changes of device
// type typ across processes (value = the holder's token, PX ttl).
func (k Keys) TypeLock(typ string) string { return k.meta("typelock:" + typ) }

// Part is the registry partition of id. Per-device state (registry, lost
// marks, alarm state) lives in keys tagged by it, independent of the shard
// count.
func Part(id string) int { return int(Hash(id) >> 54 & (registryParts - 1)) }

// partKey is the key named name in id's registry partition.
func (k Keys) partKey(id, name string) string { return k.partKeyAt(Part(id), name) }

// partKeyAt is the key named name in registry partition p, for scans over
// every partition.
func (k Keys) partKeyAt(p int, name string) string {
	return k.prefix + ":{r" + strconv.Itoa(p) + "}:" + name
}

// registrySubs is the number of registry HASHes per partition. With 64 a
// HASH holds up to 128 devices (Redis keeps it compact, as a listpack,
// below hash-max-listpack-entries 128) until 8M typed devices.
const registrySubs = 64

// Registry is the HASH (id -> type code) of devices of id's partition and
// sub-partition.
func (k Keys) Registry(id string) string {
	return k.partKey(id, "reg:"+strconv.Itoa(int(Hash(id)>>48&(registrySubs-1))))
}

// TypeCodes is the HASH of type codes (see typecodes.go).
func (k Keys) TypeCodes() string { return k.meta("types") }

// Lost is the HASH (id -> "deadline:at") of the lost marks of the devices
// in id's partition. Marks live beside the registry, not in its JSON, so
// that marking a burst of devices lost is a plain HSET each.
func (k Keys) Lost(id string) string { return k.partKey(id, "lost") }

// ThresholdLock is the STRING that serialises the threshold changes of
// device id across processes (value = the holder's token, PX ttl).
func (k Keys) ThresholdLock(id string) string { return k.partKey(id, "thrlock:"+id) }

// Group is the HASH (id -> group name) of the devices of id's partition
// and sub-partition that belong to a group.
func (k Keys) Group(id string) string {
	return k.partKey(id, "grp:"+strconv.Itoa(int(Hash(id)>>48&(registrySubs-1))))
}

// GroupMembers is the SET of the watched devices of group: a hash tag of
// its own per group, so its size is one SCARD on one slot.
func (k Keys) GroupMembers(group string) string { return k.prefix + ":{g:" + group + "}:members" }

// A leaf is the last part of a key name under one hash tag, with the
// package that owns the data: the one role that reads and writes it, or
// shard for what several share. Tags are "meta" (the installation's
// records), "r" (each registry partition), "i" (each shard) or a tag of
// the leaf's own. A name ending in ":" is a family of leaves, the rest
// being a parameter; so is a tag. No two leaves under one tag may clash
// (keys_test.go): every key name is one of these.
type leaf struct{ tag, name, owner string }

var leaves = []leaf{
	{"i", "dl", "shard"}, {"i", "rp", "shard"}, {"i", "tm", "shard"}, {"i", "wake:", "shard"},
	{"i", "owner", "shard"}, {"i", "owner:", "shard"}, {"i", "fence", "shard"}, {"i", "fence:", "shard"},
	{"i", "tp", "shard"}, {"i", "tc", "shard"}, {"i", "tx", "shard"}, {"i", "layout", "shard"},

	{"meta", "topology", "shard"}, {"meta", "generation", "shard"}, {"meta", "restore", "shard"},
	{"meta", "checkpoint", "shard"}, {"meta", "watermark", "shard"}, {"meta", "outages", "shard"},
	{"meta", "ingest", "shard"}, {"meta", "writers", "shard"}, {"meta", "drain", "shard"},
	{"meta", "scanners", "shard"}, {"meta", "scanners:", "shard"}, {"meta", "overrides", "shard"},
	{"meta", "overrides:v", "shard"}, {"meta", "types", "shard"}, {"meta", "reports", "stats"},
	{"meta", "mutes", "alarm"}, {"meta", "storms", "alarm"}, {"meta", "open:built", "alarm"},
	{"meta", "mqtt:", "ingest"}, {"meta", "held", "alarm"},
	{"meta", "typethr", "shard"}, {"meta", "typelock:", "shard"}, {"meta", "audit", "api"},

	{"r", "reg", "shard"}, {"r", "reg:", "shard"}, {"r", "grp:", "shard"}, {"r", "lost", "shard"},
	{"r", "thrlock:", "shard"}, {"r", "tf", "shard"}, {"r", "decl", "shard"},
	{"r", "alarm", "alarm"}, {"r", "open", "alarm"}, {"r", "spb", "ingest"}, {"r", "conn", "ingest"},

	{"g:", "members", "shard"},
	{"storm:", "lost", "alarm"}, {"storm:", "state", "alarm"},
	{"rate", "total", "alarm"}, {"rate", "type:", "alarm"},
	{"sink:", "sent", "sinks"}, {"sink:", "pace", "sinks"}, {"sink:", "open", "sinks"}, {"sink:", "resend", "sinks"}, {"sink:", "status", "sinks"},
}

// known panics unless name is a leaf of the table under tag: a key of a
// role is named in the table before it is used.
func known(tag, name string) {
	for _, l := range leaves {
		if l.tag == tag && (l.name == name || strings.HasSuffix(l.name, ":") && strings.HasPrefix(name, l.name)) {
			return
		}
	}
	panic("shard: key leaf " + tag + "/" + name + " is not in the table of leaves (keys.go)")
}

// Meta is the installation-wide key named leaf, in the {meta} slot.
func (k Keys) Meta(leaf string) string {
	known("meta", leaf)
	return k.meta(leaf)
}

// InPart is the key named leaf of id's registry partition: per-device
// state a role keeps beside the registry.
func (k Keys) InPart(id, leaf string) string {
	known("r", leaf)
	return k.partKey(id, leaf)
}

// Tagged is the key named leaf under a hash tag of its own, tag: the keys
// one script touches together share it. A tag ending in ":" in the table
// takes a parameter ("storm:fleet").
func (k Keys) Tagged(tag, leaf string) string {
	t, _, param := strings.Cut(tag, ":")
	if param {
		t += ":"
	}
	known(t, leaf)
	return k.prefix + ":{" + tag + "}:" + leaf
}
