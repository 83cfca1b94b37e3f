package scanner

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestResetInNewShardAnnouncesRecovery proves that a doubling loses no
// recovered event: a moved device fires from its old shard while its next
// signal is written into its new shard by a writer that found it absent
// there before the lost mark was stored, so announced nothing. The scanner
// sees the reset in the partner shard, clears the mark and announces the
// recovery, once.
func TestResetInNewShardAnnouncesRecovery(t *testing.T) {
	h := newHarness(t, 1)
	h.advanceWatermark()
	id, due := h.movedDue("r")
	reset := time.Now().Add(time.Hour).UnixMilli()
	s, _ := h.scanner("a", nil)
	var resets atomic.Int32
	// The writer's welcome ran before the mark (it found none); only its
	// write is left to land, in the new shard, before the settle.
	s.afterPublish = func(int) {
		if resets.Add(1) == 1 {
			if _, err := h.store.Upsert(h.ctx, shard.Deadlines, map[int][]shard.Entry{1: {{ID: id, Deadline: reset}}}); err != nil {
				t.Error(err)
			}
		}
	}
	stop := h.run(s)
	ev := h.recovered.Wait(t, 5*time.Second, "a recovered event", nil).Body
	testenv.Never(t, 300*time.Millisecond, "a second recovered event", func() bool { return h.recovered.Len() > 1 })
	stop()
	if ev.ID != dispatch.RecoveredID(id, due) || ev.Device != id || ev.LostAt != due {
		t.Errorf("recovered event %+v, want device %s lost at %d", ev, id, due)
	}
	if marks, _ := h.store.LostMarks().Of(h.ctx, []string{id}); marks[0] != 0 {
		t.Errorf("lost mark %d left on a device that signalled again, want none", marks[0])
	}
	if got := h.lost.Bodies(of(id)); len(got) != 1 {
		t.Errorf("%d lost events, want 1", len(got))
	}
}
