package shard_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/sigwatch/sigwatch/shard"
)

// TestUpsertAddsOnlyWhatIsAdmitted proves the write path's half of
// invariant 8: an id absent from its shard is added only if the admission
// filter admits it; the filter sees exactly the absent ids, present ones are
// pushed forward without asking it, and a failing filter adds nothing.
func TestUpsertAddsOnlyWhatIsAdmitted(t *testing.T) {
	ctx, s := newStore(t)
	upsert(t, s, 0, shard.Entry{ID: "live", Deadline: 1000})

	var asked []string
	refuse := func(ids ...string) shard.Admit {
		return func(_ context.Context, absent []shard.Entry) ([]shard.Entry, error) {
			var out []shard.Entry
			for _, e := range absent {
				asked = append(asked, e.ID)
				if !slices.Contains(ids, e.ID) {
					out = append(out, e)
				}
			}
			return out, nil
		}
	}
	es := []shard.Entry{{ID: "live", Deadline: 2000}, {ID: "old", Deadline: 2000}, {ID: "new", Deadline: 2000}}
	added, refused, err := s.UpsertAt(ctx, shard.Deadlines, 0, map[int][]shard.Entry{0: es}, refuse("old"))
	if err != nil || len(refused) != 0 {
		t.Fatalf("upsert: refused %v, err %v", refused, err)
	}
	slices.Sort(asked)
	if !slices.Equal(asked, []string{"new", "old"}) {
		t.Errorf("filter asked about %v, want the absent ids [new old]", asked)
	}
	if !slices.Equal(added, []string{"new"}) {
		t.Errorf("got added %v, want [new]", added)
	}
	if sc, _ := score(t, s, 0, "live"); sc != 2000 {
		t.Errorf("deadline of live = %d, want 2000 (present ids are pushed forward without admission)", sc)
	}
	if _, ok := score(t, s, 0, "old"); ok {
		t.Error("refused id old was written")
	}

	// A filter that fails fails the write, and adds nothing.
	boom := errors.New("boom")
	fail := func(context.Context, []shard.Entry) ([]shard.Entry, error) { return nil, boom }
	added, _, err = s.UpsertAt(ctx, shard.Deadlines, 0, map[int][]shard.Entry{0: {{ID: "other", Deadline: 3000}}}, fail)
	if !errors.Is(err, boom) || len(added) != 0 {
		t.Errorf("upsert with a failing filter: got added %v, err %v; want none and the filter's error", added, err)
	}
	if _, ok := score(t, s, 0, "other"); ok {
		t.Error("id other was written although its admission failed")
	}

	// Nothing absent: the filter is not asked at all.
	asked = nil
	if _, _, err := s.UpsertAt(ctx, shard.Deadlines, 0, map[int][]shard.Entry{0: {{ID: "live", Deadline: 4000}}}, refuse()); err != nil || len(asked) != 0 {
		t.Errorf("upsert of a present id: asked %v, err %v; want no question", asked, err)
	}
}

// TestWriterAdmitsAcrossAReplace proves that a Writer refused by a shard's
// floor places its entries again under the new topology and still adds
// only what the filter admits there.
func TestWriterAdmitsAcrossAReplace(t *testing.T) {
	ctx, s := newStore(t)
	old, cur := doubleFrom(ctx, t, s, 4)
	for i := range 4 {
		if err := s.RaiseFloor(ctx, i, cur.Epoch); err != nil {
			t.Fatal(err)
		}
	}
	w := shard.NewWriter(s, "w", func() shard.Topology { return old }, s.Topology)
	var es []shard.Entry
	for _, id := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		es = append(es, shard.Entry{ID: id, Deadline: 5000})
	}
	admit := func(_ context.Context, absent []shard.Entry) ([]shard.Entry, error) {
		var out []shard.Entry
		for _, e := range absent {
			if e.ID != "c" {
				out = append(out, e)
			}
		}
		return out, nil
	}
	added, err := w.Upsert(ctx, shard.Deadlines, es, admit)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(added)
	if want := []string{"a", "b", "d", "e", "f", "g", "h"}; !slices.Equal(added, want) {
		t.Errorf("got added %v, want %v", added, want)
	}
	if _, ok := score(t, s, shard.Of("c", 8), "c"); ok {
		t.Error("refused id c was written")
	}
}

// TestLostMarks proves the one-round-trip read of lost marks that
// admission rests on.
func TestLostMarks(t *testing.T) {
	ctx, s := newStore(t)
	if err := s.LostMarks().Mark(ctx, "x", 1234, 1300); err != nil {
		t.Fatal(err)
	}
	got, err := s.LostMarks().Of(ctx, []string{"y", "x"})
	if err != nil || !slices.Equal(got, []int64{0, 1234}) {
		t.Errorf("got %v, %v; want [0 1234]", got, err)
	}
}
