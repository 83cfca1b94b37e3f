package clock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/internal/clock"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// slack covers TIME's microsecond resolution and the millisecond rounding
// of nothing else: the bounds below are the clock's own uncertainty.
const slack = 100 * time.Microsecond

// bracketed checks that Redis server time, read between two readings of c,
// lies between them within c's uncertainty: c reads Redis time.
func bracketed(t *testing.T, c *clock.Clock, redisTime clock.Source) {
	t.Helper()
	_, unc := c.Offset()
	for range 5 {
		before := c.Now()
		srv, err := redisTime(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		after := c.Now()
		if srv.Before(before.Add(-unc-slack)) || srv.After(after.Add(unc+slack)) {
			t.Errorf("Redis time %v outside [%v, %v] ± %v read around it (invariant 9)",
				srv.Format(time.StampMicro), before.Format(time.StampMicro), after.Format(time.StampMicro), unc)
		}
	}
}

// TestSyncReadsRedisTime: after Sync the clock reads Redis server time
// within half a round trip, whatever the host clock's error (here injected
// as ±5 s), and the metrics say what the offset is.
func TestSyncReadsRedisTime(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	store := env.Store(t, "sw")
	for _, skew := range []time.Duration{0, 5 * time.Second, -5 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c, err := clock.New(store.Time, clock.Options{Skew: skew}, reg, nil)
			if err != nil {
				t.Fatal(err)
			}
			srv, err := store.Time(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Now().Sub(srv); got < skew-time.Second || got > skew+time.Second {
				t.Fatalf("before Sync the clock is %v from Redis time, want the local clock's %v", got, skew)
			}
			if err := c.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			off, unc := c.Offset()
			// Redis runs on this host: the offset undoes the injected skew.
			if d := off + skew; d < -unc-slack || d > unc+slack {
				t.Errorf("offset %v ± %v, want %v", off, unc, -skew)
			}
			if unc <= 0 || unc > 50*time.Millisecond {
				t.Errorf("uncertainty %v, want half a loopback round trip", unc)
			}
			bracketed(t, c, store.Time)
			if got := testenv.Gathered(t, reg, "sigwatch_clock_offset_seconds"); got != off.Seconds() {
				t.Errorf("sigwatch_clock_offset_seconds %v, want %v", got, off.Seconds())
			}
			if got := testenv.Gathered(t, reg, "sigwatch_clock_uncertainty_seconds"); got != unc.Seconds() {
				t.Errorf("sigwatch_clock_uncertainty_seconds %v, want %v", got, unc.Seconds())
			}
		})
	}
}

// TestSyncFailureKeepsOffset: a refresh that cannot reach Redis keeps the
// offset in force and is counted.
func TestSyncFailureKeepsOffset(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	store := env.Store(t, "sw")
	var down atomic.Bool
	src := func(ctx context.Context) (time.Time, error) {
		if down.Load() {
			return time.Time{}, errors.New("redis down")
		}
		return store.Time(ctx)
	}
	reg := prometheus.NewRegistry()
	c, err := clock.New(src, clock.Options{Skew: 3 * time.Second}, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	off, _ := c.Offset()
	down.Store(true)
	if err := c.Sync(context.Background()); err == nil {
		t.Fatal("Sync succeeded with Redis down")
	}
	if got, _ := c.Offset(); got != off {
		t.Errorf("offset %v after a failed refresh, want %v kept", got, off)
	}
	if got := testenv.Gathered(t, reg, "sigwatch_clock_sync_errors_total"); got != 1 {
		t.Errorf("sigwatch_clock_sync_errors_total %v, want 1", got)
	}
	bracketed(t, c, store.Time)
}

// TestNowNeverGoesBack: when the reference steps back (a refresh finds the
// offset lower), Now holds still until the local clock catches up; it
// never returns an earlier time than before.
func TestNowNeverGoesBack(t *testing.T) {
	var step atomic.Int64
	src := func(context.Context) (time.Time, error) { return time.Now().Add(time.Duration(step.Load())), nil }
	c, err := clock.New(src, clock.Options{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	step.Store(int64(time.Second))
	if err := c.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	high := c.Now()
	step.Store(int64(-time.Second))
	if err := c.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	prev := high
	for range 1000 {
		now := c.Now()
		if now.Before(prev) {
			t.Fatalf("Now went back from %v to %v", prev.Format(time.StampMicro), now.Format(time.StampMicro))
		}
		prev = now
	}
	if !prev.Equal(high) {
		t.Errorf("Now moved to %v within a moment of a 2 s step back, want it held at %v", prev, high)
	}
	// The held clock does not run ahead of the reference for longer than
	// the step: forward corrections apply at once.
	step.Store(int64(3 * time.Second))
	if err := c.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := time.Until(c.Now()); got < 3*time.Second-50*time.Millisecond {
		t.Errorf("after a step forward Now is %v ahead of the local clock, want 3s", got)
	}
}

// TestRunRefreshes: Run refreshes the offset periodically and returns when
// its context ends.
func TestRunRefreshes(t *testing.T) {
	var calls atomic.Int64
	src := func(context.Context) (time.Time, error) { calls.Add(1); return time.Now(), nil }
	c, err := clock.New(src, clock.Options{Config: clock.Config{Every: 10 * time.Millisecond, Samples: 2}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	testenv.WaitFor(t, 5*time.Second, "three refreshes", func() bool { return calls.Load() >= 6 })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
