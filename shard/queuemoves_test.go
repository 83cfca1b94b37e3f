package shard_test

import (
	"context"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// freshWriter is a writer that reads the topology from Redis whenever it
// places a write: it never lags.
func freshWriter(t *testing.T, s *shard.Store, name string) *shard.Writer {
	t.Helper()
	cur := func() shard.Topology {
		top, err := s.Topology(context.Background())
		if err != nil {
			t.Errorf("topology: %v", err)
		}
		return top
	}
	return shard.NewWriter(s, name, cur, s.Topology)
}

// staleWriter is a writer whose known topology is top until a shard
// refuses it; then it reads Redis, as a process that has not noticed a
// doubling does.
func staleWriter(s *shard.Store, name string, top shard.Topology) *shard.Writer {
	known := top
	return shard.NewWriter(s, name, func() shard.Topology { return known }, func(ctx context.Context) (shard.Topology, error) {
		t, err := s.Topology(ctx)
		if err == nil {
			known = t
		}
		return t, err
	})
}

// TestTimerMoveLosesToConcurrentWrites proves that a doubling's move of a
// timer never undoes a write acknowledged meanwhile: a move that read the
// old copy before a cancel, a set to an earlier deadline or a payload
// removal, and carries it after, changes nothing of what the write left.
func TestTimerMoveLosesToConcurrentWrites(t *testing.T) {
	ctx, s := newStore(t)
	if _, err := s.InitTopology(ctx, 4); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	far, earlier := now.Add(time.Hour).UnixMilli(), now.Add(30*time.Minute).UnixMilli()
	w := freshWriter(t, s, "w")
	// Timers that move in the doubling 4 → 8, one per write.
	var members []string
	for j := 0; len(members) < 3; j++ {
		m := shard.TimerMember("q", "t"+string(rune('a'+j)))
		if shard.Of(m, 4) != shard.Of(m, 8) {
			members = append(members, m)
		}
	}
	for _, m := range members {
		if err := w.ResetTimers(ctx, []shard.TimerReset{{Member: m, Deadline: far, Payload: []byte(`"x"`)}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Double(ctx, now); err != nil {
		t.Fatal(err)
	}
	writes := []struct {
		name  string
		write func(w *shard.Writer, m string) error
		check func(tm shard.Timer, ok bool) bool
	}{
		{"cancel", func(w *shard.Writer, m string) error { _, err := w.CancelTimer(ctx, m); return err },
			func(_ shard.Timer, ok bool) bool { return !ok }},
		{"set earlier", func(w *shard.Writer, m string) error {
			return w.ResetTimers(ctx, []shard.TimerReset{{Member: m, Deadline: earlier, Set: true}})
		}, func(tm shard.Timer, ok bool) bool { return ok && tm.Deadline == earlier && string(tm.Payload) == `"x"` }},
		{"payload null", func(w *shard.Writer, m string) error {
			return w.ResetTimers(ctx, []shard.TimerReset{{Member: m, Deadline: far, ClearPayload: true}})
		}, func(tm shard.Timer, ok bool) bool { return ok && tm.Deadline == far && tm.Payload == nil }},
	}
	for k, c := range writes {
		m := members[k]
		mover := freshWriter(t, s, "mover")
		read, release := make(chan struct{}), make(chan struct{})
		mover.OnMoveRead(func() { close(read); <-release })
		moved := make(chan error, 1)
		go func() { moved <- mover.MoveTimers(ctx, []string{m}, 0) }()
		<-read
		if err := c.write(freshWriter(t, s, "writer"), m); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		close(release)
		if err := <-moved; err != nil {
			t.Fatalf("%s: move: %v", c.name, err)
		}
		tm, ok, err := s.Timers().Get(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		if !c.check(tm, ok) {
			t.Errorf("%s acknowledged while a move was under way: the timer is now %+v (present %v), the move undid the write", c.name, tm, ok)
		}
	}
}

// TestStaleWriterSetLandsWhereTheTimerIs proves that a set written by a
// process that has not yet seen a doubling is not lost to the crossing
// rule: the old shard refuses it, the writer reads the topology, carries
// the timer and writes the set where the timer now is. The timer is then
// exactly what the set said.
func TestStaleWriterSetLandsWhereTheTimerIs(t *testing.T) {
	ctx, s := newStore(t)
	if _, err := s.InitTopology(ctx, 4); err != nil {
		t.Fatal(err)
	}
	before, err := s.Topology(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var m string
	for j := 0; m == ""; j++ {
		if c := shard.TimerMember("q", "s"+string(rune('a'+j))); shard.Of(c, 4) != shard.Of(c, 8) {
			m = c
		}
	}
	now := time.Now()
	d1, d2, set := now.Add(time.Hour).UnixMilli(), now.Add(2*time.Hour).UnixMilli(), now.Add(10*time.Minute).UnixMilli()
	fresh := freshWriter(t, s, "fresh")
	if err := fresh.ResetTimers(ctx, []shard.TimerReset{{Member: m, Deadline: d1, Payload: []byte(`"old"`)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Double(ctx, now); err != nil {
		t.Fatal(err)
	}
	// A process that knows the doubling extends the timer: it is carried
	// to its new shard.
	if err := fresh.ResetTimers(ctx, []shard.TimerReset{{Member: m, Deadline: d2}}); err != nil {
		t.Fatal(err)
	}
	stale := staleWriter(s, "stale", before)
	if err := stale.ResetTimers(ctx, []shard.TimerReset{{Member: m, Deadline: set, Set: true, Payload: []byte(`"new"`)}}); err != nil {
		t.Fatal(err)
	}
	tm, ok, err := s.Timers().Get(ctx, m)
	if err != nil || !ok || tm.Deadline != set || string(tm.Payload) != `"new"` {
		t.Errorf("after a set by a process that had not seen the doubling: %+v %v %v, want deadline %d with payload \"new\"", tm, ok, err, set)
	}
	for _, i := range []int{shard.Of(m, 4), shard.Of(m, 8)} {
		sc, present, err := s.Scores(ctx, shard.Timers, []int{i}, []string{m})
		if err != nil {
			t.Fatal(err)
		}
		if present[0] && sc[0] != set {
			t.Errorf("shard %d holds the timer at %d, want only the set deadline %d anywhere", i, sc[0], set)
		}
	}
}
