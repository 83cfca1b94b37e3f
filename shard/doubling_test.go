package shard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// TestDoublePublishesLayoutThenTopology proves the first step of a
// doubling: every old shard's layout says 2N (so claims see the doubling no
// later than any write under it), the topology moves to 2N/prev N/epoch+1,
// and a second doubling is refused with what to do while the first drains.
func TestDoublePublishesLayoutThenTopology(t *testing.T) {
	ctx, s := newStore(t)
	if _, err := s.InitTopology(ctx, 4); err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_000)
	got, err := s.Double(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if want := (shard.Topology{Shards: 8, Prev: 4, Epoch: 2, Since: now.UnixMilli()}); got != want {
		t.Errorf("got topology %+v, want %+v", got, want)
	}
	for i := range 4 {
		if n, _, err := s.Layout(ctx, i); err != nil || n != 8 {
			t.Errorf("shard %d: got layout %d (%v), want 8", i, n, err)
		}
	}
	if n, _, _ := s.Layout(ctx, 4); n != 0 {
		t.Errorf("new shard 4: got layout %d, want unset", n)
	}
	if err := s.RecordDrain(ctx, 1, shard.DrainState{Epoch: 2, Moved: 7}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Double(ctx, now)
	if !errors.Is(err, shard.ErrDraining) || !strings.Contains(err.Error(), "from 4 to 8 is still draining (7 moved devices left)") ||
		!strings.Contains(err.Error(), "sigwatch shards status") {
		t.Errorf("second double: got %v, want ErrDraining saying 4 to 8, 7 moved devices left and where to look", err)
	}
	if cur, _ := s.Topology(ctx); cur.Epoch != 2 {
		t.Errorf("after the refused double: epoch %d, want 2 unchanged", cur.Epoch)
	}
}

// TestDoubleRefusesAboveMaxShards proves the topology never grows past
// shard.MaxShards.
func TestDoubleRefusesAboveMaxShards(t *testing.T) {
	ctx, s := newStore(t)
	if _, err := s.InitTopology(ctx, shard.MaxShards); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Double(ctx, time.Now()); err == nil || !strings.Contains(err.Error(), "the topology stays at") {
		t.Errorf("got %v, want a refusal at MaxShards", err)
	}
}

// doubleFrom sets s at shards shards and doubles them now, returning the
// topology before and after the doubling.
func doubleFrom(ctx context.Context, t *testing.T, s *shard.Store, shards int) (old, cur shard.Topology) {
	t.Helper()
	old, err := s.InitTopology(ctx, shards)
	if err != nil {
		t.Fatal(err)
	}
	cur, err = s.Double(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return old, cur
}

// TestFloorRefusesStaleWriters proves the fence the drain rests on: once an
// old shard's floor is raised, a write placed under an older topology is
// refused and adds nothing, and a Writer places it again under the
// topology it reads and writes it where it now belongs.
func TestFloorRefusesStaleWriters(t *testing.T) {
	ctx, s := newStore(t)
	old, cur := doubleFrom(ctx, t, s, 4)
	var es []shard.Entry
	for k := range 40 {
		es = append(es, shard.Entry{ID: fmt.Sprintf("dev-%02d", k), Deadline: 1000})
	}
	// Before the floor, a write placed under the old topology lands.
	if _, refused, err := s.UpsertAt(ctx, shard.Deadlines, old.Epoch, shard.Place(es[:20], 4), nil); err != nil || len(refused) != 0 {
		t.Fatalf("write before the floor: refused %v, err %v; want it written", refused, err)
	}
	for i := range 4 {
		if err := s.RaiseFloor(ctx, i, cur.Epoch); err != nil {
			t.Fatal(err)
		}
		if err := s.RaiseFloor(ctx, i, 1); err != nil { // never lowers
			t.Fatal(err)
		}
		if _, floor, _ := s.Layout(ctx, i); floor != cur.Epoch {
			t.Fatalf("shard %d floor %d, want %d", i, floor, cur.Epoch)
		}
	}
	stale := shard.Place(es[20:], 4)
	_, refused, err := s.UpsertAt(ctx, shard.Deadlines, old.Epoch, stale, nil)
	if err != nil || len(refused) != len(stale) {
		t.Fatalf("write after the floor: refused %v of %d shards, err %v; want every shard refused", refused, len(stale), err)
	}
	for _, e := range es[20:] {
		if _, ok := score(t, s, shard.Of(e.ID, 4), e.ID); ok {
			t.Fatalf("%s written to its old shard through the floor", e.ID)
		}
	}

	// Members still present in their old shard may be pushed forward through
	// the floor (ZADD XX adds nothing, and the crossing rule takes the later
	// of a moved device's two scores); absent ones may not be added.
	later := make([]shard.Entry, 0, 20)
	for _, e := range es[:20] {
		later = append(later, shard.Entry{ID: e.ID, Deadline: 2000})
	}
	if added, refused, err := s.UpsertAt(ctx, shard.Deadlines, old.Epoch, shard.Place(later, 4), nil); err != nil || len(refused) != 0 || len(added) != 0 {
		t.Fatalf("push of present members after the floor: added %v, refused %v, err %v; want pushed, nothing added", added, refused, err)
	}
	for _, e := range later {
		if sc, ok := score(t, s, shard.Of(e.ID, 4), e.ID); !ok || sc != 2000 {
			t.Fatalf("%s: got %d (present %v) in its old shard, want 2000", e.ID, sc, ok)
		}
	}

	// A lagging writer: it still places under the old topology; the floor
	// makes it read the new one and place again.
	w := shard.NewWriter(s, "laggard", func() shard.Topology { return old }, s.Topology)
	added, err := w.Upsert(ctx, shard.Deadlines, es[20:], nil)
	if err != nil || len(added) != 20 {
		t.Fatalf("writer upsert: added %d, err %v; want 20 added", len(added), err)
	}
	for _, e := range es[20:] {
		if sc, ok := score(t, s, shard.Of(e.ID, 8), e.ID); !ok || sc != 1000 {
			t.Errorf("%s: got %d (present %v) in shard %d of 8, want 1000", e.ID, sc, ok, shard.Of(e.ID, 8))
		}
	}
	if e := w.Epoch(); e != old.Epoch {
		t.Errorf("writer epoch with nothing in flight = %d, want its topology's %d", e, old.Epoch)
	}
}

// TestDrainFinishesOnlyWhenEveryOldShardIsClean proves the third step: the
// moved members of an old shard are counted in every family, and the
// doubling ends only when every old shard reported none after its floor
// was raised for the current epoch.
func TestDrainFinishesOnlyWhenEveryOldShardIsClean(t *testing.T) {
	ctx, s := newStore(t)
	if _, err := s.InitTopology(ctx, 2); err != nil {
		t.Fatal(err)
	}
	var es []shard.Entry
	for k := range 100 {
		es = append(es, shard.Entry{ID: fmt.Sprintf("dev-%03d", k), Deadline: 1000})
	}
	if _, err := s.Upsert(ctx, shard.Deadlines, shard.Place(es, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Upsert(ctx, shard.Repeats, shard.Place(es[:10], 2)); err != nil {
		t.Fatal(err)
	}
	cur, err := s.Double(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]int64{}
	for _, e := range es {
		if o := shard.Of(e.ID, 2); shard.Of(e.ID, 4) != o {
			want[o]++
		}
	}
	for _, e := range es[:10] {
		if o := shard.Of(e.ID, 2); shard.Of(e.ID, 4) != o {
			want[o]++
		}
	}
	for i := range 2 {
		got, err := s.CountMoved(ctx, i, 4, false)
		if err != nil || got != want[i] {
			t.Errorf("shard %d: counted %d moved (%v), want %d", i, got, err, want[i])
		}
		if first, _ := s.CountMoved(ctx, i, 4, true); want[i] > 0 && first != 1 {
			t.Errorf("shard %d: first-only count %d, want 1", i, first)
		}
	}

	now := time.Now()
	finish := func() bool {
		t.Helper()
		ok, err := s.FinishDoubling(ctx, cur.Epoch, now)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if finish() {
		t.Fatal("finished with no drain report, want refused")
	}
	s.RecordDrain(ctx, 0, shard.DrainState{Epoch: cur.Epoch, Moved: 0, Floored: true})
	s.RecordDrain(ctx, 1, shard.DrainState{Epoch: cur.Epoch, Moved: 0, Floored: false})
	if finish() {
		t.Fatal("finished with shard 1 checked before its floor was raised, want refused")
	}
	s.RecordDrain(ctx, 1, shard.DrainState{Epoch: cur.Epoch - 1, Moved: 0, Floored: true})
	if finish() {
		t.Fatal("finished with shard 1 checked under an older epoch, want refused")
	}
	s.RecordDrain(ctx, 1, shard.DrainState{Epoch: cur.Epoch, Moved: 0, Floored: true})
	if ok, _ := s.FinishDoubling(ctx, cur.Epoch-1, now); ok {
		t.Fatal("finished for a stale epoch, want refused")
	}
	if !finish() {
		t.Fatal("not finished with every old shard drained, want finished")
	}
	got, _ := s.Topology(ctx)
	if want := (shard.Topology{Shards: 4, Prev: 0, Epoch: cur.Epoch + 1, Since: now.UnixMilli()}); got != want {
		t.Errorf("after finish: got %+v, want %+v", got, want)
	}
	if reports, _ := s.DrainStates(ctx); len(reports) != 0 {
		t.Errorf("drain reports after finish: %v, want none", reports)
	}
	if _, err := s.Double(ctx, now); err != nil {
		t.Errorf("double after the drain: %v, want allowed", err)
	}
}
