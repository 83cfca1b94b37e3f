package stats

import (
	"fmt"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// A process that stops reporting drops out once its report is older than
// the reader's limit, and the reader deletes it; a process that stops on
// purpose drops out at once.
func TestReportsDropStaleProcesses(t *testing.T) {
	ctx := t.Context()
	s := NewReports(testenv.New(t, testenv.Options{}).Store(t, "sw"))
	now := time.UnixMilli(1_700_000_000_000)
	const maxAge = 10 * time.Second
	for name, age := range map[string]time.Duration{"fresh": time.Second, "stale": 11 * time.Second, "leaving": 0} {
		if err := s.Put(ctx, name, Report{At: now.Add(-age).UnixMilli(), Body: `{"n":"` + name + `"}`}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete(ctx, "leaving"); err != nil {
		t.Fatal(err)
	}
	got, err := s.Fresh(ctx, now, maxAge)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Report{"fresh": {At: now.Add(-time.Second).UnixMilli(), Body: `{"n":"fresh"}`}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("reports: got %v, want %v", got, want)
	}
	// The stale report was deleted, not only left out: a reader with a
	// laxer limit does not see it either.
	if got, err := s.Fresh(ctx, now, time.Hour); err != nil || len(got) != 1 {
		t.Errorf("reports after the stale one was read past: got %v (%v), want only fresh", got, err)
	}
	// A writer prunes too, so the HASH stays small with no reader.
	if err := s.Put(ctx, "late", Report{At: now.Add(20 * time.Second).UnixMilli(), Body: "{}"}, maxAge); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Fresh(ctx, now, time.Hour); err != nil || len(got) != 1 || got["late"].Body != "{}" {
		t.Errorf("reports after a writer pruned: got %v (%v), want only late", got, err)
	}
}
