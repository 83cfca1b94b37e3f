package timer

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// journalled returns what the journal keeps of each timer, as the restore
// reads it: the record stored last.
func journalled(t *testing.T, j *dispatch.TimerJournal) map[string]dispatch.TimerState {
	t.Helper()
	got := map[string]dispatch.TimerState{}
	if err := j.Each(t.Context(), func(st dispatch.TimerState) error {
		got[shard.TimerMember(st.Queue, st.ID)] = st
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestJournalOrderFollowsRedis: a write held between Redis and the journal
// while another writer writes the same timer after it (a later reset, a
// cancel, or a reset after a cancel) reaches the journal last, with the
// older state; the journal still ends with what Redis stored last.
func TestJournalOrderFollowsRedis(t *testing.T) {
	h := newHarness(t, 4)
	ctx := t.Context()
	j, err := h.pub.OpenTimerJournal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	a := h.service("a", func(o *Options) { o.Fire, o.Journal = false, j })
	a.beforeJournal = func([]dispatch.TimerState) { held <- struct{}{}; <-release }
	b := h.service("b", func(o *Options) { o.Fire, o.Journal = false, j })
	far := time.Now().Add(time.Hour).UnixMilli()

	// first runs on a and is held after Redis stored it; then runs on b.
	race := func(first func() error, then func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- first() }()
		<-held
		if err := then(); err != nil {
			t.Fatal(err)
		}
		release <- struct{}{}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	race(func() error {
		return a.Reset(ctx, []shard.TimerReset{{Member: "orders/later", Deadline: far, Set: true, Payload: []byte(`{"v":1}`)}})
	}, func() error {
		return b.Reset(ctx, []shard.TimerReset{{Member: "orders/later", Deadline: far + 1000, Set: true, Payload: []byte(`{"v":2}`)}})
	})
	race(func() error {
		return a.Reset(ctx, []shard.TimerReset{{Member: "orders/gone", Deadline: far, Set: true}})
	}, func() error {
		_, err := b.Cancel(ctx, "orders", "gone")
		return err
	})
	if err := b.Reset(ctx, []shard.TimerReset{{Member: "orders/back", Deadline: far - 5000, Set: true}}); err != nil {
		t.Fatal(err)
	}
	race(func() error {
		_, err := a.Cancel(ctx, "orders", "back")
		return err
	}, func() error {
		return b.Reset(ctx, []shard.TimerReset{{Member: "orders/back", Deadline: far, Set: true, Payload: []byte(`{"v":3}`)}})
	})

	got := journalled(t, j)
	for m, w := range map[string]dispatch.TimerState{
		"orders/later": {Deadline: far + 1000, Payload: dispatch.RawJSON(`{"v":2}`)},
		"orders/gone":  {},
		"orders/back":  {Deadline: far, Payload: dispatch.RawJSON(`{"v":3}`)},
	} {
		if g := got[m]; g.Deadline != w.Deadline || string(g.Payload) != string(w.Payload) {
			t.Errorf("journal keeps %s as deadline %d payload %s, want what Redis stored last: deadline %d payload %s",
				m, g.Deadline, g.Payload, w.Deadline, w.Payload)
		}
	}
}

// TestJournalMatchesRedisUnderRacingWriters: two writers reset and cancel
// the same timers concurrently, in many batches; afterwards the journal
// keeps, for every timer, exactly what Redis holds.
func TestJournalMatchesRedisUnderRacingWriters(t *testing.T) {
	h := newHarness(t, 4)
	ctx := t.Context()
	j, err := h.pub.OpenTimerJournal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	svcs := []*Service{
		h.service("a", func(o *Options) { o.Fire, o.Journal = false, j }),
		h.service("b", func(o *Options) { o.Fire, o.Journal = false, j }),
	}
	const timers, rounds, workers = 200, 40, 8
	far := time.Now().Add(time.Hour).UnixMilli()
	var wg sync.WaitGroup
	for w := range workers {
		s := svcs[w%len(svcs)]
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			for r := range rounds {
				if r%10 == 9 {
					if _, err := s.Cancel(ctx, "orders", fmt.Sprint(rnd.IntN(timers))); err != nil {
						t.Error(err)
					}
					continue
				}
				rs := make([]shard.TimerReset, 0, 50)
				for _, k := range rnd.Perm(timers)[:50] {
					rs = append(rs, shard.TimerReset{Member: fmt.Sprintf("orders/%d", k), Set: true,
						Deadline: far + rnd.Int64N(100_000), Payload: fmt.Appendf(nil, `{"w":%d,"r":%d}`, w, r)})
				}
				if err := s.Reset(ctx, rs); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	got := journalled(t, j)
	wrong := 0
	for k := range timers {
		m := fmt.Sprintf("orders/%d", k)
		tm, ok, err := h.store.Timers().Get(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		g := got[m]
		if !ok {
			tm = shard.Timer{}
		}
		if g.Deadline != tm.Deadline || string(g.Payload) != string(tm.Payload) {
			if wrong++; wrong <= 5 {
				t.Errorf("%s: journal keeps deadline %d payload %s, Redis holds deadline %d payload %s", m, g.Deadline, g.Payload, tm.Deadline, tm.Payload)
			}
		}
	}
	if wrong > 0 {
		t.Fatalf("%d of %d timers journalled other than Redis holds them", wrong, timers)
	}
}
