package alarm

import (
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
)

// TestRestoredSlotsKeepThePace: 20 raises paced at 5 a second; a few are
// out when Redis loses the alarm states and the paces, and the states
// (with the send slots of the notes still waiting) are put back. Five
// devices lost after the restore are paced behind the restored notes, not
// beside them: no second holds more than the rate allows.
func TestRestoredSlotsKeepThePace(t *testing.T) {
	h := newHarness(t)
	const rate = 5
	p := Policy{Interval: time.Hour, Backoff: 1}
	a1, stop := h.alarmsWith("r1", p, func(o *Options) { o.Rate = rate })
	ids := h.loseAll("pace", "", 20)
	h.notes.WaitN(t, 10*time.Second, 4, "the first raises", func(a dispatch.Alarm) bool { return a.State == Raised })
	stop()

	// The states and the paces are lost; the states are put back.
	k := h.store.Keys()
	raws := map[string]string{}
	for _, id := range ids {
		st, err := h.alarmsLoad(id)
		if err != nil {
			t.Fatal(err)
		}
		raws[id] = st
		for _, leaf := range []string{statesLeaf, openLeaf} {
			if err := h.store.Do(h.ctx, "HDEL", []string{k.InPart(id, leaf)}, id).Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	paces := []string{k.Tagged(rateTag, rateTotalLeaf), k.Tagged(rateTag, rateTypeLeaf+h.pub.Subjects().Token(""))}
	if err := h.store.Do(h.ctx, "DEL", paces[:1]).Error(); err != nil {
		t.Fatal(err)
	}
	if err := h.store.Do(h.ctx, "DEL", paces[1:]).Error(); err != nil {
		t.Fatal(err)
	}
	a2, _ := h.alarmsWith("r2", p, func(o *Options) { o.Rate = rate })
	for _, id := range ids {
		if err := a2.PutBack(h.ctx, id, raws[id]); err != nil {
			t.Fatal(err)
		}
	}
	late := h.loseAll("late", "", 5)
	h.notes.WaitN(t, 20*time.Second, 25, "every raise", func(a dispatch.Alarm) bool { return a.State == Raised })
	// 25 slots 220 ms apart span 24 of them.
	checkPaced(t, "raises across the restore", h.storedNotes(), rate, latenessBound(t, a1, a2), 24*Spacing(rate))
	h.checkOnePerTransition(append(ids, late...))
}

// alarmsLoad reads the raw alarm state of id.
func (h *harness) alarmsLoad(id string) (string, error) {
	return h.store.Do(h.ctx, "HGET", []string{h.store.Keys().InPart(id, statesLeaf)}, id).ToString()
}
