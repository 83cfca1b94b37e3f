package shard_test

import (
	"testing"

	"github.com/sigwatch/sigwatch/shard"
)

// TestArm proves what the alarm relies on to never lose a repeat timer:
// arming lowers a later timer, keeps an earlier one that is not due, always
// changes the score of one that may be being handled (so a scanner's
// compare-and-remove or compare-and-move leaves it alone), and creates an
// absent one only when asked.
func TestArm(t *testing.T) {
	ctx, s := newStore(t)
	const f, i = shard.Repeats, 0
	arm := func(id string, at, horizon int64, create bool) (int64, bool) {
		t.Helper()
		v, ok, err := s.Arm(ctx, f, i, id, at, horizon, create)
		if err != nil {
			t.Fatal(err)
		}
		return v, ok
	}
	set := func(id string, score int64) {
		t.Helper()
		if err := s.Set(ctx, f, i, shard.Entry{ID: id, Deadline: score}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := arm("absent", 5000, 1000, false); ok {
		t.Error("arm without create added an absent timer")
	}
	if v, ok := arm("absent", 5000, 1000, true); !ok || v != 5000 {
		t.Errorf("arm with create: got %d %v, want 5000", v, ok)
	}
	cases := []struct {
		name         string
		cur, at, hor int64
		want         int64
	}{
		{"later timer lowered", 9000, 5000, 1000, 5000},
		{"earlier future timer kept", 3000, 5000, 1000, 3000},
		{"due timer replaced", 800, 5000, 1000, 5000},
		{"due timer at the same time moved", 800, 800, 1000, 801},
		{"restore only lowers", 800, 5000, 0, 800},
	}
	for _, c := range cases {
		set("d", c.cur)
		if v, _ := arm("d", c.at, c.hor, true); v != c.want {
			t.Errorf("%s: got %d, want %d", c.name, v, c.want)
		}
		if sc, _, _ := s.Score(ctx, f, i, "d"); sc != c.want {
			t.Errorf("%s: stored %d, want %d", c.name, sc, c.want)
		}
	}
}

// TestHeadAndScore reads single entries back through plain commands, whose
// replies differ from the scripts' (RESP3 pairs).
func TestHeadAndScore(t *testing.T) {
	ctx, s := newStore(t)
	if _, ok, err := s.Head(ctx, shard.Deadlines, 3); err != nil || ok {
		t.Fatalf("head of empty shard: ok %v err %v, want none", ok, err)
	}
	es := []shard.Entry{{ID: "b", Deadline: 2000}, {ID: "a", Deadline: 1000}}
	if _, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{3: es}); err != nil {
		t.Fatal(err)
	}
	h, ok, err := s.Head(ctx, shard.Deadlines, 3)
	if err != nil || !ok || h != es[1] {
		t.Fatalf("head = %+v %v %v, want %+v", h, ok, err, es[1])
	}
	if d, ok, err := s.Score(ctx, shard.Deadlines, 3, "b"); err != nil || !ok || d != 2000 {
		t.Fatalf("score of b = %d %v %v, want 2000", d, ok, err)
	}
}
