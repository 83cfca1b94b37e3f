package shard

import "github.com/redis/rueidis"

// Client returns the underlying client.
func (s *Store) Client() rueidis.Client { return s.c }

// Parts is the number of registry partitions (see Part).
const Parts = registryParts

// PartKey returns a key named name in id's registry partition, for packages
// (alarm) that keep more per-device state beside the registry.
func (k Keys) PartKey(id, name string) string { return k.partKey(id, name) }

// PartKeyAt is PartKey for partition p, for scans over every partition.
func (k Keys) PartKeyAt(p int, name string) string { return k.partKeyAt(p, name) }
