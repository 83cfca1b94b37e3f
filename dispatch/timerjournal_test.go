package dispatch

import (
	"fmt"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestTimerJournalKeepsLatestPerTimer: a Write larger than many fast
// batches stores every record; a later Write of a timer replaces its
// record, a tombstone included, so the journal holds one per timer.
func TestTimerJournalKeepsLatestPerTimer(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	ctx := t.Context()
	p, err := New(ctx, env.Conn(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	j, err := p.OpenTimerJournal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 12_345
	far := time.Now().Add(time.Hour).UnixMilli()
	states := make([]TimerState, n)
	for k := range states {
		states[k] = TimerState{Queue: "q", ID: fmt.Sprintf("t/%d", k), Deadline: far}
	}
	for round, d := range []int64{far, far + 7} {
		for k := range states {
			states[k].Deadline = d
		}
		if round == 1 {
			states[0].Deadline, states[1].Payload = 0, RawJSON(`{"a":1}`)
		}
		for k, err := range j.Write(ctx, states, time.Now()) {
			if err != nil {
				t.Fatalf("record %d: %v", k, err)
			}
		}
	}
	got := map[string]TimerState{}
	if err := j.Each(ctx, func(st TimerState) error {
		if _, dup := got[st.ID]; dup {
			t.Errorf("%s twice in the journal", st.ID)
		}
		got[st.ID] = st
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("journal holds %d timers, want %d", len(got), n)
	}
	if g := got["t/0"]; g.Deadline != 0 {
		t.Errorf("t/0 is %+v, want its tombstone", g)
	}
	if g := got["t/1"]; g.Deadline != far+7 || string(g.Payload) != `{"a":1}` {
		t.Errorf("t/1 is %+v, want deadline %d with its payload", g, far+7)
	}
	if g := got["t/9999"]; g.Deadline != far+7 || g.Stored == 0 {
		t.Errorf("t/9999 is %+v, want deadline %d, stored at some time", g, far+7)
	}
}
