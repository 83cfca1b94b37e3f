package alarm

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
)

// TestRaiseThroughput measures how many raises a second one replica
// publishes when 2,000 devices are lost at once, with and without the
// durable registry (whose write each notification now waits for). It is a
// measurement, run with SIGWATCH_MEASURE=1.
func TestRaiseThroughput(t *testing.T) {
	if os.Getenv("SIGWATCH_MEASURE") == "" {
		t.Skip("a measurement: set SIGWATCH_MEASURE=1")
	}
	for _, withRegistry := range []bool{false, true} {
		h := newHarness(t)
		const n = 2000
		var with func(*Options)
		if withRegistry {
			reg, err := h.pub.OpenRegistry(h.ctx)
			if err != nil {
				t.Fatal(err)
			}
			var recs []dispatch.DeviceRecord
			for k := range n {
				recs = append(recs, dispatch.DeviceRecord{ID: deviceID("tp", k)})
			}
			for _, err := range reg.Add(h.ctx, recs, func(*dispatch.DeviceRecord, bool) (bool, bool) { return false, false }) {
				if err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(h.ctx)
			done := make(chan struct{})
			go func() { _ = reg.Run(ctx); close(done) }()
			t.Cleanup(func() { cancel(); <-done })
			with = func(o *Options) { o.Registry = reg }
		}
		h.alarmsWith("r1", Policy{Interval: time.Hour, Backoff: 1}, with)
		h.loseAll("tp", "", n)
		ev := h.notes.WaitN(t, 60*time.Second, n, "every raise", func(a dispatch.Alarm) bool { return a.State == Raised })
		notes := h.storedNotes()
		first, last := notes[0].Time, notes[len(notes)-1].Time
		took := last.Sub(first)
		t.Logf("registry %v: %d raises in %v: %.0f notifications/s", withRegistry, len(ev), took.Round(time.Millisecond),
			float64(len(notes))/took.Seconds())
	}
}

func deviceID(prefix string, k int) string { return fmt.Sprintf("%s-%02d", prefix, k) }
