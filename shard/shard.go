package shard

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/rueidis"
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

// Family names one kind of timer. Every family has one ZSET per shard under
// the shard's hash tag. Deadlines live under the configured prefix; the
// alarm's repeat timers are a second queue of the same kind under
// "<prefix>:alarm" (Store.Sub("alarm")), with a topology and leases of its own.
type Family string

const (
	// Deadlines holds one member per watched device, scored by the time it
	// is declared lost unless it signals first.
	Deadlines Family = "dl"
	// Repeats holds the next repeat time of each active alarm.
	Repeats Family = "rp"
	// Timers holds the generic timers of every queue, member
	// TimerMember(queue, id), in the deadlines' shards: they share their
	// topology, doubling and floors, with leases of their own
	// (Store.Leases).
	Timers Family = "tm"
)

// Families lists every timer family. A doubling drains only when none of
// them holds a moved member in an old shard.
var Families = []Family{Deadlines, Repeats, Timers}

// Entry is one timer: a member of a shard ZSET and its deadline in unix ms.
type Entry struct {
	ID       string
	Deadline int64
}

// parseEntries reads a flat (member, score, ...) reply, as scripts return
// it, or RESP3's list of (member, score) pairs.
func parseEntries(v []rueidis.RedisMessage) ([]Entry, error) {
	if len(v) > 0 && v[0].IsArray() {
		flat := make([]rueidis.RedisMessage, 0, 2*len(v))
		for _, pair := range v {
			p, err := pair.ToArray()
			if err != nil || len(p) != 2 {
				return nil, errors.New("malformed member/score pair")
			}
			flat = append(flat, p...)
		}
		v = flat
	}
	if len(v)%2 != 0 {
		return nil, errors.New("odd member/score reply")
	}
	es := make([]Entry, 0, len(v)/2)
	for j := 0; j < len(v); j += 2 {
		id, err := v[j].ToString()
		if err != nil {
			return nil, err
		}
		sc, err := v[j+1].AsFloat64()
		if err != nil {
			return nil, err
		}
		es = append(es, Entry{ID: id, Deadline: int64(sc)})
	}
	return es, nil
}

// Store is sigwatch's view of Redis: one shared rueidis client and the key
// layout. It is safe for concurrent use; calls from many goroutines are
// auto-pipelined by rueidis. The client never leaves the package: every
// Redis operation of sigwatch is a method of Store.
type Store struct {
	c rueidis.Client // a bounded client
	k Keys
	// gen is the generation the scripts check (nil: none, see Unchecked).
	gen *generation
	// types caches the registry's type codes.
	types *typeCodes
}

// NewStore wraps a rueidis client.
func NewStore(c rueidis.Client, keys Keys) *Store {
	return &Store{c: newBounded(c), k: keys, gen: new(generation), types: new(typeCodes)}
}

// Leases returns the same store with the lease, fence and membership keys
// of name: an engine over the same shards that leases them apart from the
// deadline scanners (the generic timers).
func (s *Store) Leases(name string) *Store {
	k := s.k
	k.lease = ":" + name
	return &Store{c: s.c, k: k, gen: s.gen, types: s.types}
}

// Sub returns the same client under the key layout "<prefix>:<name>",
// sharing the installation's records: a store for records of its own, such
// as the generic timers' watermark, or a second sharded queue with its own
// topology and leases, such as the alarm's repeat timers (Sub("alarm"),
// the layout Keys.Alarm).
func (s *Store) Sub(name string) *Store {
	return &Store{c: s.c, k: Keys{prefix: s.k.prefix + ":" + name, root: s.k.root}, gen: s.gen, types: new(typeCodes)}
}

// Keys returns the store's key layout: a role names its own keys with it.
func (s *Store) Keys() Keys { return s.k }
