package queue

import (
	"context"
	"fmt"

	"github.com/sigwatch/sigwatch/shard"
)

// crossing returns the shard counts a claimed batch must be checked across:
// the drain of the topology the engine knows (prev, shards), or, while a
// doubling is published that the engine has not seen yet (the shard's
// layout is above the shard count it knows), the count it knows and the
// layout. A check across counts where nothing moved is wasted, never wrong:
// the partner shard then holds nothing.
func crossing(t shard.Topology, layout int) (prev, cur int, ok bool) {
	switch {
	case t.Prev != 0:
		return t.Prev, t.Shards, true
	case layout > t.Shards:
		return t.Shards, layout, true
	}
	return 0, 0, false
}

// Outcomes of the crossing rule, the label of crossing_total.
const (
	crossStale = "stale"           // the partner holds a later (or, for the old shard, equal) deadline
	crossElse  = "fired_elsewhere" // the partner already fired at this deadline or later
	crossFire  = "fire"            // this copy is the device's effective deadline
)

// movedEntry is a due entry of a device that moved in the doubling.
type movedEntry struct {
	j       int  // index in the claimed batch
	partner int  // the other of its old and new shard
	isNew   bool // this copy is in its new shard
}

// cross applies the crossing rule to a claimed batch of shard i while a
// doubling from prev to cur shards drains. The effective deadline of a
// moved device is the later of its copies in its old and new shard, so a
// copy fires only if the partner holds no later one, an equal one only from
// the new shard, and only if the partner has not already fired at this
// deadline or later. It returns the entries to fire and the stale copies to
// remove without firing (compare-and-remove, so a reset landing meanwhile
// survives). A stale copy in the partner is left to the partner's owner: it
// drops it when it falls due.
//
// The reads are ordered so that a fire elsewhere is never missed: the
// partner's owner marks a device fired (Handler.Fired reads the mark)
// before it removes its copy, so a copy seen absent is followed by a mark
// seen set, unless the device came back meanwhile, which the second read of the partner sees. Invariant 3
// across the crossing rests on that order.
func (e *Engine) cross(ctx context.Context, i, prev, cur int, due []shard.Entry) (fire, stale []shard.Entry, err error) {
	var moved []movedEntry
	keep := make([]bool, len(due))
	for j, d := range due {
		// An entry in neither its old nor its new shard cannot exist: the
		// floors of the previous doubling refuse writers older than prev.
		old, nw := shard.Of(d.ID, prev), shard.Of(d.ID, cur)
		if old == nw || (i != old && i != nw) {
			keep[j] = true
			continue
		}
		partner := nw
		if i == nw {
			partner = old
		}
		moved = append(moved, movedEntry{j: j, partner: partner, isNew: i == nw})
	}
	if len(moved) == 0 {
		return due, nil, nil
	}
	staleBy := func(m movedEntry, score int64, present bool) bool {
		d := due[m.j].Deadline
		return present && (score > d || score == d && !m.isNew)
	}
	scores := func(ms []movedEntry) ([]int64, []bool, error) {
		ids, shards := make([]string, len(ms)), make([]int, len(ms))
		for k, m := range ms {
			ids[k], shards[k] = due[m.j].ID, m.partner
		}
		return e.store.Scores(ctx, e.opts.Family, shards, ids)
	}

	sc, present, err := scores(moved)
	if err != nil {
		return nil, nil, fmt.Errorf("queue: shard %d: partner scores: %w", i, err)
	}
	var candidates []movedEntry
	for k, m := range moved {
		if staleBy(m, sc[k], present[k]) {
			stale = append(stale, due[m.j])
			e.m.crossing.WithLabelValues(crossStale).Inc()
			continue
		}
		candidates = append(candidates, m)
	}
	if len(candidates) > 0 {
		ids := make([]string, len(candidates))
		for k, m := range candidates {
			ids[k] = due[m.j].ID
		}
		firedAt, err := e.h.Fired(ctx, ids)
		if err != nil {
			return nil, nil, fmt.Errorf("queue: shard %d: %w", i, err)
		}
		sc, present, err := scores(candidates)
		if err != nil {
			return nil, nil, fmt.Errorf("queue: shard %d: partner scores: %w", i, err)
		}
		for k, m := range candidates {
			switch {
			case firedAt[k] >= due[m.j].Deadline:
				stale = append(stale, due[m.j])
				e.m.crossing.WithLabelValues(crossElse).Inc()
			case staleBy(m, sc[k], present[k]):
				stale = append(stale, due[m.j])
				e.m.crossing.WithLabelValues(crossStale).Inc()
			default:
				keep[m.j] = true
				e.m.crossing.WithLabelValues(crossFire).Inc()
			}
		}
	}
	fire = make([]shard.Entry, 0, len(due)-len(stale))
	for j, d := range due {
		if keep[j] {
			fire = append(fire, d)
		}
	}
	return fire, stale, nil
}

// revivedElsewhere tells the handler of each moved entry of shard i it fired
// that a reset revived in the partner shard meanwhile: a signal written
// under the other topology lands there, not in the fired copy, so the
// settle cannot see it. The writer found the device absent there and, if
// it did so before the device was marked lost, announced no recovery; the
// handler does (Revived clears the mark only if it is still the one of
// this deadline, so a recovery already announced is not announced again).
// It reads the partners after the settle, so after the mark: a reset it
// misses was written after it, and its writer saw the mark.
func (e *Engine) revivedElsewhere(ctx context.Context, i, prev, cur int, handled []shard.Entry) error {
	var (
		fired  []shard.Entry
		shards []int
		ids    []string
	)
	for _, f := range handled {
		old, nw := shard.Of(f.ID, prev), shard.Of(f.ID, cur)
		if old == nw || (i != old && i != nw) {
			continue
		}
		partner := nw
		if i == nw {
			partner = old
		}
		fired, shards, ids = append(fired, f), append(shards, partner), append(ids, f.ID)
	}
	if len(fired) == 0 {
		return nil
	}
	sc, present, err := e.store.Scores(ctx, e.opts.Family, shards, ids)
	if err != nil {
		return fmt.Errorf("queue: shard %d: partner scores after firing: %w", i, err)
	}
	for k, f := range fired {
		if !present[k] || sc[k] <= f.Deadline {
			continue
		}
		e.m.revived.Inc()
		if err := e.h.Revived(ctx, f, shard.Entry{ID: f.ID, Deadline: sc[k]}); err != nil {
			return err
		}
	}
	return nil
}
