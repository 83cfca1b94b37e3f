package ingest

import (
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestIdleProbesSlowUntilAsked proves what an idle ingest costs and that it
// answers a scanner at once: with nobody waiting for the watermark it probes
// every IdleProbeInterval, and a WantWatermark (a scanner has something due
// that waits for the watermark) brings the full rate back, for fastHold
// after the last ask.
func TestIdleProbesSlowUntilAsked(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	ctx := t.Context()
	r.start(t, Options{Config: Config{ProbeInterval: 10 * time.Millisecond, IdleProbeInterval: 250 * time.Millisecond}})
	// advances counts how often the watermark moved over d, read every 5ms.
	advances := func(d time.Duration, during func()) int {
		n, last := 0, int64(0)
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if during != nil {
				during()
			}
			wm, _, err := r.store.Watermarks().Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if wm != last {
				n, last = n+1, wm
			}
		}
		return n
	}
	time.Sleep(fastHold + 300*time.Millisecond) // past the start's full rate
	if n := advances(time.Second, nil); n > 6 {
		t.Errorf("idle: the watermark moved %d times in 1s, want about 4 (one probe per 250ms)", n)
	}
	var asked time.Time
	ask := func() {
		if time.Since(asked) >= 100*time.Millisecond {
			asked = time.Now()
			if err := r.store.Watermarks().Want(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := advances(time.Second, ask); n < 30 {
		t.Errorf("asked: the watermark moved %d times in 1s, want most of the 100 probes of the full rate", n)
	}
	// The first probe after an ask goes out at once, not at the next tick.
	time.Sleep(fastHold + 300*time.Millisecond)
	wm0, _, err := r.store.Watermarks().Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if err := r.store.Watermarks().Want(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Second, "the watermark to move after one ask", func() bool {
		wm, _, err := r.store.Watermarks().Read(ctx)
		return err == nil && wm > wm0
	})
	if d := time.Since(at); d > 100*time.Millisecond {
		t.Errorf("the watermark moved %v after an ask, want within a probe round trip", d)
	}
}
