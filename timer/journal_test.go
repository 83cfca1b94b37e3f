package timer

import (
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// TestJournalKeepsLastStateOfDurableQueues: a reset is journalled as the
// timer Redis kept (an extend's later deadline, a payload kept by a reset
// that did not name one), a cancel as a tombstone, and a queue with
// durable off is not journalled at all.
func TestJournalKeepsLastStateOfDurableQueues(t *testing.T) {
	h := newHarness(t, 4)
	ctx := t.Context()
	j, err := h.pub.OpenTimerJournal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	off := false
	s := h.service("a", func(o *Options) {
		o.Fire, o.Journal = false, j
		o.Queues = map[string]QueueConfig{"scratch": {Durable: &off}}
	})
	far := time.Now().Add(time.Hour).UnixMilli()
	for _, rs := range [][]shard.TimerReset{
		{{Member: "orders/a", Deadline: far, Payload: []byte(`{"c":1}`)}, {Member: "orders/b", Deadline: far}},
		{{Member: "orders/a", Deadline: far - 1000}}, // an earlier extend: the deadline holds, the payload stays
		{{Member: "orders/b", Deadline: far + 5, Set: true}, {Member: "scratch/x", Deadline: far}},
	} {
		if err := s.Reset(ctx, rs); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Cancel(ctx, "orders", "c"); err != nil {
		t.Fatal(err)
	}
	got := map[string]dispatch.TimerState{}
	if err := j.Each(ctx, func(st dispatch.TimerState) error {
		got[st.Queue+"/"+st.ID] = st
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]dispatch.TimerState{
		"orders/a": {Queue: "orders", ID: "a", Deadline: far, Payload: dispatch.RawJSON(`{"c":1}`)},
		"orders/b": {Queue: "orders", ID: "b", Deadline: far + 5},
		"orders/c": {Queue: "orders", ID: "c"},
	}
	if len(got) != len(want) {
		t.Fatalf("journal holds %v, want %v", got, want)
	}
	for k, w := range want {
		g := got[k]
		if g.Deadline != w.Deadline || string(g.Payload) != string(w.Payload) || g.Stored == 0 {
			t.Errorf("journal holds %s as %+v, want %+v stored at some time", k, g, w)
		}
	}
}
