package alarm

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// TestAnnouncedStateIsKept: every notification's state is in the durable
// registry before the notification is in the stream (the registry's
// background writer does not run here, so only that write can put it
// there). Then the alarm states are lost from Redis right after the last
// notifications and put back from the registry: each alarm goes on where
// its last notification left it (no second raise, repeat counts in a row,
// nothing stored twice).
func TestAnnouncedStateIsKept(t *testing.T) {
	h := newHarness(t)
	reg, err := h.pub.OpenRegistry(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	var recs []dispatch.DeviceRecord
	for k := range n {
		recs = append(recs, dispatch.DeviceRecord{ID: fmt.Sprintf("ann-%02d", k)})
	}
	for _, err := range reg.Add(h.ctx, recs, func(*dispatch.DeviceRecord, bool) (bool, bool) { return false, false }) {
		if err != nil {
			t.Fatal(err)
		}
	}
	p := Policy{Interval: interval, Backoff: 1}
	withReg := func(o *Options) { o.Registry = reg }
	_, stop := h.alarmsWith("r1", p, withReg)
	// Each notification, as soon as the stream has it, is in the registry.
	h.notes.Require(func(e note) error {
		rec, _, err := reg.Get(h.ctx, e.Body.Device)
		if err == nil && !announced(rec.Alarm, e.Body) {
			return fmt.Errorf("notification %s was in the stream before its state was in the registry (it holds %s)", e.Body.ID, rec.Alarm)
		}
		return err
	})
	ids := h.raiseAll("ann", n)
	for _, id := range ids {
		h.notes.Wait(t, 30*time.Second, id+" repeat 2", func(a dispatch.Alarm) bool {
			return a.Device == id && a.State == Repeat && a.Count >= 2
		})
	}
	stop()

	// The states are lost from Redis; the registry's are put back.
	k := h.store.Keys()
	for _, id := range ids {
		if err := h.store.Do(h.ctx, "HDEL", []string{k.InPart(id, statesLeaf)}, id).Error(); err != nil {
			t.Fatal(err)
		}
		if err := h.store.Do(h.ctx, "HDEL", []string{k.InPart(id, openLeaf)}, id).Error(); err != nil {
			t.Fatal(err)
		}
	}
	a2, _ := h.alarmsWith("r2", p, withReg)
	for _, id := range ids {
		notes := h.notesOf(id)
		last := notes[len(notes)-1].Body
		rec, _, err := reg.Get(h.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !announced(rec.Alarm, last) {
			t.Errorf("%s: the registry holds %s, not the state that announced %s", id, rec.Alarm, last.ID)
		}
		if err := a2.PutBack(h.ctx, id, rec.Alarm); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		notes := h.notesOf(id)
		after := notes[len(notes)-1].Body.Count + 2
		h.notes.Wait(t, 30*time.Second, id+" repeats on", func(a dispatch.Alarm) bool {
			return a.Device == id && a.State == Repeat && a.Count >= after
		})
	}
	h.checkOnePerTransition(ids)
}

// announced reports whether raw, a stored alarm state, is the state that
// announced n or a later one of the same alarm.
func announced(raw string, n dispatch.Alarm) bool {
	var st State
	if raw == "" || json.Unmarshal([]byte(raw), &st) != nil || st.Since != n.Since {
		return false
	}
	return slices.ContainsFunc(st.Pending, func(p Note) bool { return p.ID == n.ID }) || st.Count >= n.Count
}

// TestPutBackWhileItsTimerIsHandled: a state put back while a scanner
// handles the device's old timer (claimed, found without a state, about to
// be removed by compare-and-remove on its claimed score) keeps a timer: the
// put back gives it a new score, so the removal leaves it, and the alarm
// repeats.
func TestPutBackWhileItsTimerIsHandled(t *testing.T) {
	h := newSteppedHarness(t)
	const id = "put-1"
	r1, stop := h.alarms("r1", policy())
	h.signal(id, "")
	h.wait(id, Raised, "", 5*time.Second)
	v, ok, err := r1.Get(h.ctx, id)
	if err != nil || !ok || v.Next == 0 {
		t.Fatalf("alarm of %s: %+v %v %v, want a repeat to come", id, v, ok, err)
	}
	raw, err := h.alarmsLoad(id)
	if err != nil {
		t.Fatal(err)
	}
	stop()

	// The states are lost; the repeat timer comes due and is claimed.
	k := h.store.Keys()
	for _, leaf := range []string{statesLeaf, openLeaf} {
		if err := h.store.Do(h.ctx, "HDEL", []string{k.InPart(id, leaf)}, id).Error(); err != nil {
			t.Fatal(err)
		}
	}
	claimed := v.Next
	h.clock.Set(time.UnixMilli(claimed))
	i := shard.Of(id, 4)
	remove, _, err := r1.wake(h.ctx, i, shard.Entry{ID: id, Deadline: claimed}, h.clock.Now(), dispatch.Fence{})
	if err != nil || !remove {
		t.Fatalf("wake without a state: remove %v, %v; want remove", remove, err)
	}
	// The state is put back before the scanner settles.
	if err := r1.PutBack(h.ctx, id, raw); err != nil {
		t.Fatal(err)
	}
	timers := h.timers.Keys().Timers(shard.Repeats, i)
	removed, err := h.timers.Do(h.ctx, "EVAL", nil,
		`if redis.call('ZSCORE', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('ZREM', KEYS[1], ARGV[1]) end return 0`,
		"1", timers, id, fmt.Sprint(claimed)).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	if removed != 0 {
		t.Errorf("the scanner's compare-and-remove took the timer of the state put back")
	}
	h.clock.Set(time.UnixMilli(claimed + 10))
	h.alarms("r2", policy())
	h.wait(id, Repeat, "", 5*time.Second)
}
