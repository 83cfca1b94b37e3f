package shard_test

import (
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// TestLowerFollowsTheReport: an offline report lowers a watched device's
// deadline to the report plus its type's confirm_after, recording why and
// when the device was last heard of; a deadline set by a signal newer than
// the report stands, and so do absent devices and deadlines already due.
// The device's own word (ttd 0) reaches past its threshold, up to the
// longest deadline it may declare.
func TestLowerFollowsTheReport(t *testing.T) {
	ctx, s := newStore(t)
	w, err := shard.NewWatcher(ctx, s, 4, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	thr := shard.NewThresholds(s, 10*time.Second, map[string]time.Duration{"plug": time.Minute})
	thr.Confirm = map[string]time.Duration{"plug": 2 * time.Second}
	thr.MaxDeclared = time.Hour
	devs := shard.NewDevices(s, w, thr, nil)
	now := time.Now().UnixMilli()
	put := func(id string, at int64) { upsert(t, s, shard.Of(id, 4), shard.Entry{ID: id, Deadline: at}) }
	put("quiet", now-5_000+10_000) // last signal 5 s ago, default threshold
	put("newer", now+1_000+10_000) // a signal 1 s after the report landed first
	put("due", now-1)
	put("plug", now+time.Minute.Milliseconds()) // typed by the caller
	put("ttd", now+30*time.Minute.Milliseconds())

	lowered, err := devs.Lower(ctx, []shard.Lowering{
		{ID: "quiet", Report: now, Reason: shard.ReasonWill},
		{ID: "newer", Report: now, Reason: shard.ReasonWill},
		{ID: "due", Report: now, Reason: shard.ReasonWill},
		{ID: "absent", Report: now, Reason: shard.ReasonWill},
		{ID: "plug", Type: "plug", Report: now, Reason: shard.ReasonDeath},
		{ID: "ttd", Report: now, Reason: shard.ReasonDeclared, Own: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{true, false, false, false, true, true}
	for j, ok := range want {
		if lowered[j] != ok {
			t.Errorf("lowering %d: lowered %v, want %v", j, lowered[j], ok)
		}
	}
	check := func(id string, at int64) {
		t.Helper()
		if got, _ := score(t, s, shard.Of(id, 4), id); got != at {
			t.Errorf("%s: deadline %d, want %d", id, got, at)
		}
	}
	check("quiet", now)
	check("newer", now+11_000)
	check("due", now-1)
	check("plug", now+2_000)
	check("ttd", now)
	if _, ok := score(t, s, shard.Of("absent", 4), "absent"); ok {
		t.Error("absent device was added")
	}

	_, ds, err := s.DevicesDeclared(ctx, []string{"quiet", "plug", "newer"})
	if err != nil {
		t.Fatal(err)
	}
	if d := ds[0]; d.Reason != shard.ReasonWill || d.At != now || d.LastSeen != now-5_000 {
		t.Errorf("quiet's record: %+v, want will at %d last seen %d", d, now, now-5_000)
	}
	if d := ds[1]; d.Reason != shard.ReasonDeath || d.At != now+2_000 || d.Confirm != 2_000 || d.LastSeen != now {
		t.Errorf("plug's record: %+v, want death at %d, confirm 2000, last seen %d", d, now+2_000, now)
	}
	// A record whose lowering did not apply stands for another deadline
	// than the device's: it is ignored when the device fires.
	if d := ds[2]; d.At == now+11_000 {
		t.Errorf("newer's record %+v matches its deadline", d)
	}
}
