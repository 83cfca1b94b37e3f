package shard

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/rueidis"
)

// LostMarks is the marks of devices declared lost, each the deadline it was
// lost at and when, kept by registry partition: a scanner marks before it
// publishes and undoes what it could not publish, a revived device's mark
// is cleared, ingest and the alarms read them, the guard keeps them in its
// checkpoint. Mark, Clear, Of and All are in registry.go.
type LostMarks struct{ s *Store }

// LostMarks returns the lost marks' operations.
func (s *Store) LostMarks() LostMarks { return LostMarks{s} }

// The lost marks a scanner writes before it publishes a batch's lost
// events, and undoes for the events it could not publish: one script run
// per Redis slot.

// swapLostScript writes lost marks and returns the ones they replaced.
//
// KEYS[j]: lost marks of device j's partition
// ARGV[2j-1]: device j's id; ARGV[2j]: its new mark, "<deadline>:<at>"
// Returns: for each device, the previous mark or nil.
var swapLostScript = NewScript(`
local out = {}
for j = 1, #KEYS do
  local id = ARGV[2*j-1]
  out[j] = redis.call('HGET', KEYS[j], id) or false
  redis.call('HSET', KEYS[j], id, ARGV[2*j])
end
return out`)

// PrevMark is the lost mark a SwapMulti replaced (zero if none).
type PrevMark struct{ Deadline, At int64 }

// SwapMulti marks each device of lost lost at its deadline, as
// Mark does, and returns the marks it replaced, in one round trip: a
// scanner learns which of its deadlines an earlier owner already marked
// (and so may have published). Each slot's devices are swapped by one
// script run (see bySlot).
func (m LostMarks) SwapMulti(ctx context.Context, lost []Entry, at int64) ([]PrevMark, []error) {
	groups := m.s.bySlot(lost)
	execs := make([]rueidis.LuaExec, len(groups))
	for g, js := range groups {
		execs[g] = rueidis.LuaExec{Keys: make([]string, len(js)), Args: make([]string, 0, 2*len(js))}
		for k, j := range js {
			e := lost[j]
			execs[g].Keys[k] = m.s.k.Lost(e.ID)
			execs[g].Args = append(execs[g].Args, e.ID, lostMark(e.Deadline, at))
		}
	}
	prev := make([]PrevMark, len(lost))
	errs := make([]error, len(lost))
	for g, r := range swapLostScript.execMulti(ctx, m.s.c, execs...) {
		vs, err := r.messages()
		if err == nil && len(vs) != len(groups[g]) {
			err = errors.New("unexpected reply")
		}
		for k, j := range groups[g] {
			if err != nil {
				errs[j] = fmt.Errorf("shard: mark device lost: %w", err)
				continue
			}
			// None, or a corrupt previous mark, reads as none.
			if v, verr := vs[k].ToString(); verr == nil {
				prev[j].Deadline, prev[j].At, _ = parseLostMark(v)
			}
		}
	}
	return prev, errs
}

// unmarkLostScript undoes lost marks that are still the exact value
// written, putting back the mark each replaced (or none): a later mark (a
// new owner's, for the same deadline, differs in its time) stays, and a
// mark this one overwrote comes back.
//
// KEYS[j]: lost marks of device j's partition
// ARGV[3j-2]: device j's id; ARGV[3j-1]: the mark written,
// "<deadline>:<at>"; ARGV[3j]: the mark it replaced, "" if none
// Returns: for each device, 1 if its mark was undone, else 0.
var unmarkLostScript = NewScript(`
local out = {}
for j = 1, #KEYS do
  local id = ARGV[3*j-2]
  out[j] = 0
  if redis.call('HGET', KEYS[j], id) == ARGV[3*j-1] then
    if ARGV[3*j] == '' then
      redis.call('HDEL', KEYS[j], id)
    else
      redis.call('HSET', KEYS[j], id, ARGV[3*j])
    end
    out[j] = 1
  end
end
return out`)

// UnmarkMulti undoes SwapMulti(lost, at) for each entry whose
// mark is still the one that call wrote, putting back prev[j], the mark it
// replaced; one round trip, one error per entry. A scanner undoes the marks
// of events it could not publish.
func (m LostMarks) UnmarkMulti(ctx context.Context, lost []Entry, at int64, prev []PrevMark) []error {
	groups := m.s.bySlot(lost)
	execs := make([]rueidis.LuaExec, len(groups))
	for g, js := range groups {
		execs[g] = rueidis.LuaExec{Keys: make([]string, len(js)), Args: make([]string, 0, 3*len(js))}
		for k, j := range js {
			e, back := lost[j], ""
			if p := prev[j]; p.Deadline != 0 || p.At != 0 {
				back = lostMark(p.Deadline, p.At)
			}
			execs[g].Keys[k] = m.s.k.Lost(e.ID)
			execs[g].Args = append(execs[g].Args, e.ID, lostMark(e.Deadline, at), back)
		}
	}
	errs := make([]error, len(lost))
	for g, r := range unmarkLostScript.execMulti(ctx, m.s.c, execs...) {
		if err := r.Error(); err != nil {
			for _, j := range groups[g] {
				errs[j] = fmt.Errorf("shard: undo lost mark: %w", err)
			}
		}
	}
	return errs
}

// bySlot groups the indexes of es by the Redis slot their registry
// partition's keys live in, for scripts that touch many devices in one
// run: on Redis Cluster one group per partition (a script's keys must share
// a slot), elsewhere one group, since every key is on the one server.
func (s *Store) bySlot(es []Entry) [][]int {
	if len(es) == 0 {
		return nil
	}
	if s.c.Mode() != rueidis.ClientModeCluster {
		all := make([]int, len(es))
		for j := range es {
			all[j] = j
		}
		return [][]int{all}
	}
	at := map[int]int{}
	var groups [][]int
	for j, e := range es {
		p := Part(e.ID)
		g, ok := at[p]
		if !ok {
			g = len(groups)
			at[p] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], j)
	}
	return groups
}
