package alarm

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// The open index lists the states that are not idle, per registry
// partition (openLeaf), kept by the same compare-and-set that writes a
// state, so that listing and counting the open alarms reads only them. A
// marker in {meta} says it was built from the states once; a Redis that
// lost its meta keys builds it again.

// indexBuiltLeaf names the marker: when the index was last built (unix
// ms, by the builder's clock).
const indexBuiltLeaf = "open:built"

// isOpen says whether a stored state belongs in the open index.
func isOpen(raw string) bool {
	var st struct {
		Phase Phase `json:"phase"`
	}
	return json.Unmarshal([]byte(raw), &st) == nil && st.Phase != Idle
}

// indexMu serialises this process's builds of the open index.
var indexMu sync.Mutex

// rebuildEvery is how often the replica that counts the open alarms builds
// the open index again from every state: it heals what a writer that does
// not keep the index (a replica of an older version, during a rolling
// upgrade) left out, at a small fraction of what counting from every state
// cost.
const rebuildEvery = time.Hour

// ensureIndex builds the open-alarm index if this Redis has none yet (an
// installation from before it, or a Redis that lost its meta keys) or, with
// stale set, if it was built longer than rebuildEvery ago.
func (a *Alarms) ensureIndex(ctx context.Context, stale bool) error {
	due := func() (bool, error) {
		at, built, err := a.indexBuilt(ctx)
		return err == nil && (!built || stale && a.opts.Now().Sub(time.UnixMilli(at)) > rebuildEvery), err
	}
	if ok, err := due(); err != nil || !ok {
		return err
	}
	indexMu.Lock()
	defer indexMu.Unlock()
	if ok, err := due(); err != nil || !ok {
		return err
	}
	a.log.Info("building the index of open alarms from every alarm state")
	return a.buildIndex(ctx, a.opts.Now())
}

// indexBuilt returns when the open index was last built on this Redis;
// ok is false if it never was.
func (a *Alarms) indexBuilt(ctx context.Context) (at int64, ok bool, err error) {
	r := a.store.Do(ctx, "GET", []string{a.store.Keys().Meta(indexBuiltLeaf)})
	if r.IsNil() {
		return 0, false, nil
	}
	if at, err = r.AsInt64(); err != nil {
		return 0, false, fmt.Errorf("alarm: read open index marker: %w", err)
	}
	return at, true, nil
}

// buildIndex makes the open index of every partition agree with the
// states, and then marks it built at now. It scans every state once, 32
// partitions at a time, and may run beside transitions and other builders:
// each entry is set only if its state is still the one judged (a
// transition that changed it kept the index itself). Stale entries (no
// state, or a state no longer open) are removed the same way.
func (a *Alarms) buildIndex(ctx context.Context, now time.Time) error {
	k := a.store.Keys()
	// A few partitions at a time: their states are held in memory.
	const batch = 32
	for lo := 0; lo < shard.Parts; lo += batch {
		hi := min(lo+batch, shard.Parts)
		states, indexed := map[string]string{}, map[string]string{}
		if err := a.store.ScanParts(ctx, statesLeaf, lo, hi, func(id, v string) { states[id] = v }); err != nil {
			return err
		}
		if err := a.store.ScanParts(ctx, openLeaf, lo, hi, func(id, v string) { indexed[id] = v }); err != nil {
			return err
		}
		var fixes []swap
		fix := func(id, state string, open bool) {
			fixes = append(fixes, swap{key: k.InPart(id, statesLeaf), field: id, old: state, next: state,
				index: k.InPart(id, openLeaf), open: open})
		}
		for id, v := range states {
			open := isOpen(v)
			if iv, ok := indexed[id]; open && iv != v || !open && ok {
				fix(id, v, open)
			}
		}
		for id := range indexed {
			if _, ok := states[id]; !ok {
				fix(id, "", false)
			}
		}
		if _, err := a.swaps(ctx, fixes...); err != nil {
			return fmt.Errorf("alarm: build open index: %w", err)
		}
	}
	if err := a.store.Do(ctx, "SET", []string{k.Meta(indexBuiltLeaf)}, strconv.FormatInt(now.UnixMilli(), 10)).Error(); err != nil {
		return fmt.Errorf("alarm: mark open index built: %w", err)
	}
	return nil
}

// openStates calls fn with every entry of the open index: the states of
// the open alarms, without reading the idle ones.
func (a *Alarms) openStates(ctx context.Context, fn func(id, state string)) error {
	return a.store.ScanParts(ctx, openLeaf, 0, shard.Parts, fn)
}
