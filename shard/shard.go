// Package shard owns where timers live in Redis: the hashing of an id to one
// of 2^n shards, the key layout, the topology record, the leases that give
// each shard one scanner at a time, and the Lua scripts that touch shard keys.
package shard

import (
	"fmt"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// MaxShards bounds the shard count so key names and lease sets stay small.
const MaxShards = 1 << 16

// Hash is the 64-bit xxhash of a device id; every placement decision uses it.
func Hash(id string) uint64 { return xxhash.Sum64String(id) }

// Of returns the shard of id among n shards. n must be a power of two, so a
// doubling sends each id either nowhere or to Of(id, n)+n.
func Of(id string, n int) int { return int(Hash(id) & uint64(n-1)) }

// ValidCount reports whether n can be a shard count.
func ValidCount(n int) error {
	if n < 1 || n > MaxShards || bits.OnesCount(uint(n)) != 1 {
		return fmt.Errorf("shard count %d must be a power of two between 1 and %d", n, MaxShards)
	}
	return nil
}

// Entry is one timer: a member of a shard ZSET and its deadline in unix ms.
type Entry struct {
	ID       string
	Deadline int64
}

// Assign returns the shards of n that replica should own when the live
// replicas are live: shard i goes to the (i mod R)-th replica in sorted
// order, so ownership is even and every replica computes the same answer
// from the same view. live must be sorted.
func Assign(n int, live []string, replica string) []int {
	pos := -1
	for j, r := range live {
		if r == replica {
			pos = j
			break
		}
	}
	if pos < 0 {
		return nil
	}
	var out []int
	for i := pos; i < n; i += len(live) {
		out = append(out, i)
	}
	return out
}
