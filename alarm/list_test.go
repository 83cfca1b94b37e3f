package alarm

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// openIndexMatches checks that the open-alarm index holds exactly the
// non-idle states, each as stored.
func openIndexMatches(t *testing.T, h *harness, when string) {
	t.Helper()
	want, got := map[string]string{}, map[string]string{}
	if err := h.store.ScanParts(h.ctx, statesLeaf, 0, shard.Parts, func(id, v string) {
		if isOpen(v) {
			want[id] = v
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := (&Alarms{store: h.store}).openStates(h.ctx, func(id, v string) { got[id] = v }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: open index %v, want the open states %v", when, got, want)
	}
}

// listIDs lists the open alarms in state, 2 a page, and returns their ids.
func listIDs(t *testing.T, a *Alarms, state string) []string {
	t.Helper()
	var ids []string
	q := Query{State: state, Limit: 2}
	for {
		rows, next, err := a.List(t.Context(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			ids = append(ids, r.Device)
		}
		if q.Cursor = next; next == "" {
			slices.Sort(ids)
			return ids
		}
	}
}

// TestOpenIndexAndListsFollowTransitions: through raised, recovered, acked
// (resolved and paused) and muted alarms, and states put back after a loss,
// the open-alarm index holds exactly the open states and the listing by
// state exactly the alarms in it.
func TestOpenIndexAndListsFollowTransitions(t *testing.T) {
	h := newHarness(t)
	a, stop := h.alarms("a", policy())
	ids := h.raiseAll("ix", 6)
	h.waitAll(ids, Raised, "", 5*time.Second)
	h.recoverAll(ids[:1])
	if _, err := a.Ack(h.ctx, ids[1], time.Now().Add(time.Hour), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Ack(h.ctx, ids[2], time.Time{}, ""); err != nil {
		t.Fatal(err)
	}
	m, err := a.AddMute(h.ctx, Mute{Device: ids[3], Until: time.Now().Add(time.Hour).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	// States stand still once the replica stops (repeats are its timers').
	stop()
	openIndexMatches(t, h, "after transitions")
	for state, want := range map[string][]string{
		"":           {ids[1], ids[3], ids[4], ids[5]},
		ListActive:   {ids[3], ids[4], ids[5]},
		ListAcked:    {ids[1]},
		ListMuted:    {ids[3]},
		ListFlapping: nil,
		// Several states: any of them.
		ListActive + "," + ListAcked: {ids[1], ids[3], ids[4], ids[5]},
		ListAcked + "," + ListMuted:  {ids[1], ids[3]},
	} {
		if got := listIDs(t, a, state); !slices.Equal(got, want) {
			t.Errorf("state=%q lists %v, want %v", state, got, want)
		}
	}
	rows, _, err := a.List(h.ctx, Query{State: ListMuted})
	if err != nil || len(rows) != 1 || !rows[0].Muted || rows[0].Mute != m.ID || rows[0].State != ListActive || rows[0].Since == 0 {
		t.Errorf("muted row %+v, %v; want %s active, muted by %s", rows, err, ids[3], m.ID)
	}

	// Put back from the durable registry: a later open state over an idle
	// one, and a later idle state over an open one.
	put := func(id string, phase Phase) {
		t.Helper()
		st, err := a.load(h.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		next := st.State
		next.Version += 5
		next.Phase = phase
		if phase == Active {
			next.Since, next.Next = time.Now().UnixMilli(), time.Now().Add(time.Hour).UnixMilli()
		}
		raw, _ := json.Marshal(next)
		if err := a.PutBack(h.ctx, id, string(raw)); err != nil {
			t.Fatal(err)
		}
	}
	put(ids[0], Active)
	put(ids[4], Idle)
	openIndexMatches(t, h, "after PutBack")
	if got, want := listIDs(t, a, ListActive), []string{ids[0], ids[3], ids[5]}; !slices.Equal(got, want) {
		t.Errorf("after PutBack state=active lists %v, want %v", got, want)
	}
	if c, _, err := a.count(h.ctx); err != nil || c != (counts{raised: 3, acked: 1}) {
		t.Errorf("count = %+v, %v; want 3 raised, 1 acked", c, err)
	}
	if _, _, err := a.List(h.ctx, Query{State: "active,nope"}); err == nil {
		t.Error("state=active,nope: no error, want the unknown state refused")
	}
}
