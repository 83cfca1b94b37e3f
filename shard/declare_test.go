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

	_, ds, err := s.DevicesDeclared(ctx, []string{"quiet", "plug", "newer"}, []int64{now, now + 2_000, now + 11_000})
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
	// than the device's: none is found for the deadline that stands.
	if d := ds[2]; d.Reason != "" {
		t.Errorf("newer's record for its deadline %d: %+v, want none", now+11_000, d)
	}
}

// TestRecordsKeepEachDeadline: a device keeps a record per deadline, its
// latest few: a later record whose deadline did not win (a ttd that GT
// refused, a will whose lowering did not apply) does not hide the record
// of the deadline that stands; firing forgets the spent records and keeps
// one written after the fire.
func TestRecordsKeepEachDeadline(t *testing.T) {
	ctx, s := newStore(t)
	const id = "dev"
	rec := func(reason string, at int64) {
		t.Helper()
		if err := s.Record(ctx, []shard.Declaration{{ID: id, Reason: reason, At: at, LastSeen: at - 1}}); err != nil {
			t.Fatal(err)
		}
	}
	want := func(at int64, reason string) {
		t.Helper()
		_, ds, err := s.DevicesDeclared(ctx, []string{id}, []int64{at})
		if err != nil {
			t.Fatal(err)
		}
		if ds[0].Reason != reason || reason != "" && (ds[0].At != at || ds[0].LastSeen != at-1) {
			t.Errorf("record for %d: %+v, want %q", at, ds[0], reason)
		}
	}
	rec(shard.ReasonExpired, 600_000) // ttd 600: the deadline that stands
	rec(shard.ReasonExpired, 2_000)   // a later ttd 2, refused by GT
	rec(shard.ReasonWill, 1_500)      // a will whose lowering did not apply
	want(600_000, shard.ReasonExpired)
	want(2_000, shard.ReasonExpired)
	want(1_500, shard.ReasonWill)
	rec(shard.ReasonDeath, 2_000) // the same deadline again: the newer record
	want(2_000, shard.ReasonDeath)
	for k := range 5 {
		rec(shard.ReasonExpired, int64(10+k))
	}
	want(600_000, "") // the oldest beyond the few kept
	want(14, shard.ReasonExpired)

	rec(shard.ReasonWill, 700_000) // written after the fire below
	s.ForgetDeclarations(ctx, []shard.Declaration{{ID: id, At: 14}})
	want(14, "")
	want(12, "")
	want(700_000, shard.ReasonWill)
	s.ForgetDeclarations(ctx, []shard.Declaration{{ID: id, At: 700_000}})
	want(700_000, "")
}
