package shard

import "strconv"

// Family names one kind of timer. Every family has one ZSET per shard under
// the shard's hash tag. Deadlines live under the configured prefix; the
// alarm's repeat timers are a second queue of the same kind under
// "<prefix>:alarm", with a topology and leases of its own.
type Family string

const (
	// Deadlines holds one member per watched device, scored by the time it
	// is declared lost unless it signals first.
	Deadlines Family = "dl"
	// Repeats holds the next repeat time of each active alarm.
	Repeats Family = "rp"
)

// Families lists every timer family. A doubling drains only when none of
// them holds a moved member in an old shard.
var Families = []Family{Deadlines, Repeats}

// registryParts is the fixed number of registry partitions. It is independent
// of the shard count so that a doubling never moves registry entries.
const registryParts = 1024

// Keys builds every Redis key name sigwatch uses. No key is assembled
// anywhere else.
type Keys struct{ prefix string }

// NewKeys returns the key layout under prefix (default "sw").
func NewKeys(prefix string) Keys {
	if prefix == "" {
		prefix = "sw"
	}
	return Keys{prefix: prefix}
}

// Prefix returns the configured key prefix.
func (k Keys) Prefix() string { return k.prefix }

func (k Keys) shardKey(i int, name string) string {
	return k.prefix + ":{" + strconv.Itoa(i) + "}:" + name
}

// Timers is the ZSET of family f in shard i.
func (k Keys) Timers(f Family, i int) string { return k.shardKey(i, string(f)) }

// Owner holds the lease of the scanner that owns shard i.
func (k Keys) Owner(i int) string { return k.shardKey(i, "owner") }

// Fence is the counter that hands out fencing tokens for shard i's lease.
func (k Keys) Fence(i int) string { return k.shardKey(i, "fence") }

// Layout is the HASH of shard i that fences placement across a doubling:
// "shards" is the largest shard count any writer may place shard i's timers
// under (set for every old shard before a doubling is published, and read
// by every claim), "floor" the epoch below which writes to shard i are
// refused (set when the drain begins to check shard i).
func (k Keys) Layout(i int) string { return k.shardKey(i, "layout") }

func (k Keys) meta(name string) string { return k.prefix + ":{meta}:" + name }

// Topology is the HASH with shards, prev and epoch.
func (k Keys) Topology() string { return k.meta("topology") }

// Watermark is the time up to which ingest is known to have been consuming.
func (k Keys) Watermark() string { return k.meta("watermark") }

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
func (k Keys) Scanners() string { return k.meta("scanners") }

// Overrides is the HASH of per-device thresholds (id -> ms).
func (k Keys) Overrides() string { return k.meta("overrides") }

// OverridesVersion changes whenever Overrides does, so caches reload cheaply.
func (k Keys) OverridesVersion() string { return k.meta("overrides:v") }

// Part is the registry partition of id. Per-device state (registry, alarm)
// lives in keys tagged by it, independent of the shard count.
func Part(id string) int { return int(Hash(id) >> 54 & (registryParts - 1)) }

func (k Keys) partKey(id, name string) string {
	return k.prefix + ":{r" + strconv.Itoa(Part(id)) + "}:" + name
}

// Registry is the HASH (id -> JSON) of devices in id's partition.
func (k Keys) Registry(id string) string { return k.partKey(id, "reg") }

// Lost is the HASH (id -> "deadline:at") of the lost marks of the devices
// in id's partition. Marks live beside the registry, not in its JSON, so
// that marking a burst of devices lost is a plain HSET each.
func (k Keys) Lost(id string) string { return k.partKey(id, "lost") }

// PartKey returns a key named name in id's registry partition, for packages
// (alarm) that keep more per-device state beside the registry.
func (k Keys) PartKey(id, name string) string { return k.partKey(id, name) }
