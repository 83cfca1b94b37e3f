package queue

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// TestResetInPartnerRevives proves invariant 4 across a doubling: a reset
// that lands in a moved device's other shard (written under the other
// topology) between claim and settle of its fired copy is a reset all the
// same, and the handler is told of it, so that a recovery is announced even
// when the writer found the device absent before it was marked lost.
func TestResetInPartnerRevives(t *testing.T) {
	for _, firedInNew := range []bool{false, true} {
		name := "fired in old shard"
		if firedInNew {
			name = "fired in new shard"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			var id string
			for k := 0; id == ""; k++ {
				if c := fmt.Sprintf("m-%d", k); shard.Of(c, 2) == 1 {
					id = c
				}
			}
			due := time.Now().Add(-10 * time.Millisecond).UnixMilli()
			reset := time.Now().Add(time.Hour).UnixMilli()
			from, to := 0, 1
			if firedInNew {
				from, to = 1, 0 // a lagging writer's reset lands in the old shard
			}
			if _, err := h.store.Double(h.ctx, time.Now()); err != nil {
				t.Fatal(err)
			}
			if _, err := h.topo.Refresh(h.ctx); err != nil {
				t.Fatal(err)
			}
			put := func(i int, dl int64) {
				t.Helper()
				if _, err := h.store.Upsert(h.ctx, shard.Deadlines, map[int][]shard.Entry{i: {{ID: id, Deadline: dl}}}); err != nil {
					t.Error(err)
				}
			}
			put(from, due)
			var fires atomic.Int32
			hd := &handler{fire: func(b Batch) ([]shard.Entry, []shard.Move, error) {
				if fires.Add(1) == 1 {
					put(to, reset) // the device signals while its lost event goes out
				}
				return b.Due, nil, nil
			}}
			h.runUntil(hd, nil, "the fired copy settled", func() bool {
				_, ok, _ := h.store.Score(h.ctx, shard.Deadlines, from, id)
				return !ok && fires.Load() > 0
			})
			hd.mu.Lock()
			defer hd.mu.Unlock()
			want := [2]shard.Entry{{ID: id, Deadline: due}, {ID: id, Deadline: reset}}
			if len(hd.revived) != 1 || hd.revived[0] != want {
				t.Errorf("Revived told %v, want [%v]", hd.revived, want)
			}
			if sc, ok, _ := h.store.Score(h.ctx, shard.Deadlines, to, id); !ok || sc != reset {
				t.Errorf("partner copy %d (present %v), want the reset %d kept", sc, ok, reset)
			}
		})
	}
}
