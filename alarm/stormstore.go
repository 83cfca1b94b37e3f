package alarm

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// A storm scope keeps, under a hash tag of its own ({storm:<scope>}), the
// devices of the scope that are lost (a ZSET scored by the deadline they
// were lost at) and the storm's state (a STRING changed only by
// compare-and-set). An index in {meta} lists the scopes that had a storm,
// latest change first.

const (
	stormTag       = "storm:"
	stormLostLeaf  = "lost"
	stormStateLeaf = "state"
	stormIndexLeaf = "storms"
)

func (a *Alarms) stormLostKey(sc string) string {
	return a.store.Keys().Tagged(stormTag+sc, stormLostLeaf)
}

func (a *Alarms) stormStateKey(sc string) string {
	return a.store.Keys().Tagged(stormTag+sc, stormStateLeaf)
}

// stormIndexCap bounds the storm index: the oldest scopes beyond it are
// dropped from the listing (their state stays).
const stormIndexCap = 1000

// stormCount is what a scope's lost set holds after a change: recent are
// the members lost at or after the window's start, lost all of them, and
// state the scope's storm state ("" when it never had one).
type stormCount struct {
	recent, lost int64
	state        string
}

// countLoss records that id was lost at deadline in each scope of scopes
// and counts each scope's lost devices from since on, in one round trip.
// It is idempotent: handling a lost event again changes nothing.
func (a *Alarms) countLoss(ctx context.Context, scopes []string, id string, deadline, since int64) ([]stormCount, error) {
	cmds := make([]shard.Cmd, 0, 4*len(scopes))
	for _, sc := range scopes {
		lost := []string{a.stormLostKey(sc)}
		cmds = append(cmds,
			shard.Cmd{Name: "ZADD", Keys: lost, Args: []string{strconv.FormatInt(deadline, 10), id}},
			shard.Cmd{Name: "ZCOUNT", Keys: lost, Args: []string{strconv.FormatInt(since, 10), "+inf"}},
			shard.Cmd{Name: "ZCARD", Keys: lost},
			shard.Cmd{Name: "GET", Keys: []string{a.stormStateKey(sc)}})
	}
	return a.stormCounts(ctx, scopes, cmds, "record storm loss")
}

// countBack removes id from the lost devices of each scope of scopes and
// counts what remains, in one round trip.
func (a *Alarms) countBack(ctx context.Context, scopes []string, id string) ([]stormCount, error) {
	cmds := make([]shard.Cmd, 0, 4*len(scopes))
	for _, sc := range scopes {
		lost := []string{a.stormLostKey(sc)}
		cmds = append(cmds,
			shard.Cmd{Name: "ZREM", Keys: lost, Args: []string{id}},
			shard.Cmd{Name: "ZCARD", Keys: lost},
			shard.Cmd{Name: "ZCARD", Keys: lost},
			shard.Cmd{Name: "GET", Keys: []string{a.stormStateKey(sc)}})
	}
	return a.stormCounts(ctx, scopes, cmds, "record storm recovery")
}

func (a *Alarms) stormCounts(ctx context.Context, scopes []string, cmds []shard.Cmd, what string) ([]stormCount, error) {
	out := make([]stormCount, len(scopes))
	rs := a.store.DoMulti(ctx, cmds...)
	for j := range scopes {
		r := rs[4*j : 4*j+4]
		if err := r[0].Error(); err != nil {
			return nil, fmt.Errorf("alarm: %s: %w", what, err)
		}
		var err error
		if out[j].recent, err = r[1].AsInt64(); err == nil {
			out[j].lost, err = r[2].AsInt64()
		}
		if err == nil && !r[3].IsNil() {
			out[j].state, err = r[3].ToString()
		}
		if err != nil {
			return nil, fmt.Errorf("alarm: %s: %w", what, err)
		}
	}
	return out, nil
}

// lostSince counts the devices of scope sc lost at or after from.
func (a *Alarms) lostSince(ctx context.Context, sc string, from int64) (int64, error) {
	n, err := a.store.Do(ctx, "ZCOUNT", []string{a.stormLostKey(sc)}, strconv.FormatInt(from, 10), "+inf").AsInt64()
	if err != nil {
		return 0, fmt.Errorf("alarm: count storm losses: %w", err)
	}
	return n, nil
}

// lostMembers calls fn with the lost devices of scope sc, a page at a
// time.
func (a *Alarms) lostMembers(ctx context.Context, sc string, fn func(ids []string) error) error {
	key := []string{a.stormLostKey(sc)}
	cursor := "0"
	for {
		v, err := a.store.Do(ctx, "ZSCAN", key, cursor, "COUNT", "500").Array()
		if err == nil && len(v) != 2 {
			err = fmt.Errorf("unexpected reply")
		}
		var elems []string
		if err == nil {
			if cursor, err = v[0].ToString(); err == nil {
				elems, err = v[1].AsStrSlice()
			}
		}
		if err != nil {
			return fmt.Errorf("alarm: scan storm members: %w", err)
		}
		// The reply alternates member and score.
		ids := make([]string, 0, len(elems)/2)
		for j := 0; j+1 < len(elems); j += 2 {
			ids = append(ids, elems[j])
		}
		if len(ids) > 0 {
			if err := fn(ids); err != nil {
				return err
			}
		}
		if cursor == "0" {
			return nil
		}
	}
}

// StormDevices returns the devices of scope ("group:<name>" or "fleet",
// as StormScope makes it) counted lost now, the ones GET /v1/storms
// counts in lost: at most limit of them, the earliest lost first (by the
// deadline they were lost at, then id), returned sorted by id; and how
// many there are in all. A scope that never had a lost device has none.
// limit <= 0 gives only the total. One round trip.
func (a *Alarms) StormDevices(ctx context.Context, scope string, limit int) (devices []string, total int, err error) {
	key := []string{a.stormLostKey(scope)}
	cmds := []shard.Cmd{{Name: "ZCARD", Keys: key}}
	if limit > 0 {
		cmds = append(cmds, shard.Cmd{Name: "ZRANGE", Keys: key, Args: []string{"0", strconv.Itoa(limit - 1)}})
	}
	rs := a.store.DoMulti(ctx, cmds...)
	n, err := rs[0].AsInt64()
	if err != nil {
		return nil, 0, fmt.Errorf("alarm: read storm devices: %w", err)
	}
	if limit > 0 {
		if devices, err = rs[1].AsStrSlice(); err != nil {
			return nil, 0, fmt.Errorf("alarm: read storm devices: %w", err)
		}
		slices.Sort(devices)
	}
	if devices == nil {
		devices = []string{}
	}
	return devices, int(n), nil
}

// readStorm returns the storm state of scope sc, "" when there is none.
func (a *Alarms) readStorm(ctx context.Context, sc string) (string, error) {
	r := a.store.Do(ctx, "GET", []string{a.stormStateKey(sc)})
	if r.IsNil() {
		return "", nil
	}
	v, err := r.ToString()
	if err != nil {
		return "", fmt.Errorf("alarm: read storm state: %w", err)
	}
	return v, nil
}

// swapStorm replaces the storm state of scope sc with next if it is still
// old ("" for none), reports whether it did, and lists the scope in the
// storm index at time at.
func (a *Alarms) swapStorm(ctx context.Context, sc, old, next string, at int64) (bool, error) {
	ok, err := a.swaps(ctx, swap{key: a.stormStateKey(sc), old: old, next: next})
	if err != nil {
		return false, fmt.Errorf("alarm: write storm state: %w", err)
	}
	if !ok[0] {
		return false, nil
	}
	index := []string{a.store.Keys().Meta(stormIndexLeaf)}
	for _, r := range a.store.DoMulti(ctx,
		shard.Cmd{Name: "ZADD", Keys: index, Args: []string{strconv.FormatInt(at, 10), sc}},
		shard.Cmd{Name: "ZREMRANGEBYRANK", Keys: index, Args: []string{"0", strconv.Itoa(-stormIndexCap - 1)}}) {
		if err := r.Error(); err != nil {
			return true, fmt.Errorf("alarm: index storm: %w", err)
		}
	}
	return true, nil
}

// stormScopes returns up to limit scopes of the storm index, latest change
// first, with their states ("" if gone).
func (a *Alarms) stormScopes(ctx context.Context, limit int) (scopes, states []string, err error) {
	scopes, err = a.store.Do(ctx, "ZRANGE", []string{a.store.Keys().Meta(stormIndexLeaf)},
		"+inf", "-inf", "BYSCORE", "REV", "LIMIT", "0", strconv.Itoa(limit)).AsStrSlice()
	if err != nil {
		return nil, nil, fmt.Errorf("alarm: read storm index: %w", err)
	}
	if len(scopes) == 0 {
		return nil, nil, nil
	}
	cmds := make([]shard.Cmd, len(scopes))
	for j, sc := range scopes {
		cmds[j] = shard.Cmd{Name: "GET", Keys: []string{a.stormStateKey(sc)}}
	}
	states = make([]string, len(scopes))
	for j, r := range a.store.DoMulti(ctx, cmds...) {
		if r.IsNil() {
			continue
		}
		if states[j], err = r.ToString(); err != nil {
			return nil, nil, fmt.Errorf("alarm: read storm state: %w", err)
		}
	}
	return scopes, states, nil
}

// liveCounts counts, now, the lost devices of each scope of scopes and its
// watched devices (a group's members, lost or not; the fleet's deadlines
// and lost marks, read at most a second ago), in one round trip.
func (a *Alarms) liveCounts(ctx context.Context, scopes []string) (lost, size []int64, err error) {
	cmds := make([]shard.Cmd, 0, 2*len(scopes))
	for _, sc := range scopes {
		cmds = append(cmds, shard.Cmd{Name: "ZCARD", Keys: []string{a.stormLostKey(sc)}})
		if _, g := scopeName(sc); g != "" {
			cmds = append(cmds, shard.Cmd{Name: "SCARD", Keys: []string{a.store.Keys().GroupMembers(g)}})
		}
	}
	rs := a.store.DoMulti(ctx, cmds...)
	lost, size = make([]int64, len(scopes)), make([]int64, len(scopes))
	k := 0
	for j, sc := range scopes {
		if lost[j], err = rs[k].AsInt64(); err != nil {
			return nil, nil, fmt.Errorf("alarm: count storm devices: %w", err)
		}
		k++
		if _, g := scopeName(sc); g == "" {
			if size[j], err = a.watched(ctx, sc); err != nil {
				return nil, nil, err
			}
			continue
		}
		if size[j], err = rs[k].AsInt64(); err != nil {
			return nil, nil, fmt.Errorf("alarm: count storm devices: %w", err)
		}
		k++
	}
	return lost, size, nil
}

// heldLeaf names the held alarms by the storm that holds them, as the
// replica that counts the open alarms last counted them (JSON: scope →
// count; "" for those waiting out the storm hold).
const heldLeaf = "held"

// writeHeld stores the held alarms by storm for ttl.
func (a *Alarms) writeHeld(ctx context.Context, held map[string]int64, ttl time.Duration) error {
	b, _ := json.Marshal(held)
	if err := a.store.Do(ctx, "SET", []string{a.store.Keys().Meta(heldLeaf)}, string(b), "PX",
		strconv.FormatInt(ttl.Milliseconds(), 10)).Error(); err != nil {
		return fmt.Errorf("alarm: write held counts: %w", err)
	}
	return nil
}

// readHeld returns the held alarms by storm last counted (none if no
// replica counted them lately).
func (a *Alarms) readHeld(ctx context.Context) (map[string]int64, error) {
	r := a.store.Do(ctx, "GET", []string{a.store.Keys().Meta(heldLeaf)})
	if r.IsNil() {
		return nil, nil
	}
	v, err := r.ToString()
	if err != nil {
		return nil, fmt.Errorf("alarm: read held counts: %w", err)
	}
	var held map[string]int64
	if err := json.Unmarshal([]byte(v), &held); err != nil {
		return nil, fmt.Errorf("alarm: held counts are corrupt: %w", err)
	}
	return held, nil
}
