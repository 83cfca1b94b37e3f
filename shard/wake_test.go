package shard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// wakes subscribes to the wake notices of family f of s and returns the
// shards woken, once the subscription stands.
func wakes(t *testing.T, s *shard.Store, f shard.Family) <-chan int {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	subscribed := make(chan struct{}, 1)
	woke := make(chan int, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Wakes(ctx, f, func() {
			select {
			case subscribed <- struct{}{}:
			default:
			}
		}, func(i int) { woke <- i })
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-subscribed:
	case <-time.After(10 * time.Second):
		t.Fatal("the wake subscription did not stand within 10s")
	}
	return woke
}

// expectWake fails unless shard i is woken within a second.
func expectWake(t *testing.T, woke <-chan int, i int, what string) {
	t.Helper()
	select {
	case got := <-woke:
		if got != i {
			t.Fatalf("%s: woke shard %d, want %d", what, got, i)
		}
	case <-time.After(time.Second):
		t.Fatalf("%s: shard %d not woken", what, i)
	}
}

// expectNoWake fails if any shard is woken within 200ms.
func expectNoWake(t *testing.T, woke <-chan int, what string) {
	t.Helper()
	select {
	case got := <-woke:
		t.Fatalf("%s: woke shard %d, want no wake", what, got)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestWritesEarlierThanTheClaimWake proves the wake rule of every write
// that can put a member earlier than a sleeping shard's head: a claim that
// found nothing due records when its loop looks again; a later write does
// not wake it, an earlier one does, once (until the next claim records
// again). Deadlines (a new device, a lowered threshold), alarm repeats
// (Arm) and generic timers (reset) each go through their own script.
func TestWritesEarlierThanTheClaimWake(t *testing.T) {
	ctx, s, d := newDevices(t, 4, time.Hour)
	now := time.Now()
	at := func(d time.Duration) int64 { return now.Add(d).UnixMilli() }
	claim := func(s *shard.Store, f shard.Family, i int, l shard.Lease) {
		t.Helper()
		if c, err := s.Claim(ctx, f, i, l, now.UnixMilli(), 10, now.Add(time.Hour)); err != nil || len(c.Due) != 0 {
			t.Fatalf("claim shard %d: %v due, %v; want nothing due", i, c.Due, err)
		}
	}
	id := func(prefix string, i int) string {
		for k := 0; ; k++ {
			if id := fmt.Sprintf("%s%d", prefix, k); shard.Of(id, 4) == i {
				return id
			}
		}
	}

	t.Run("deadlines", func(t *testing.T) {
		woke := wakes(t, s, shard.Deadlines)
		l := acquire(t, s, 1, "a")
		upsert(t, s, 1, shard.Entry{ID: id("head", 1), Deadline: at(30 * time.Minute)})
		claim(s, shard.Deadlines, 1, l) // sleeps until the head, 30m away
		upsert(t, s, 1, shard.Entry{ID: id("late", 1), Deadline: at(40 * time.Minute)})
		expectNoWake(t, woke, "a new device after the head")
		upsert(t, s, 1, shard.Entry{ID: id("early", 1), Deadline: at(10 * time.Minute)})
		expectWake(t, woke, 1, "a new device before the head")
		upsert(t, s, 1, shard.Entry{ID: id("earlier", 1), Deadline: at(5 * time.Minute)})
		expectNoWake(t, woke, "a second early device before the loop claimed again")

		claim(s, shard.Deadlines, 1, l) // sleeps until "earlier", 5m away
		if _, err := d.SetThreshold(ctx, id("late", 1), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		expectWake(t, woke, 1, "a threshold lowered below the head")

		claim(s, shard.Deadlines, 1, l)
		if err := s.Set(ctx, shard.Deadlines, 1, shard.Entry{ID: id("late", 1), Deadline: at(time.Second)}); err != nil {
			t.Fatal(err)
		}
		expectWake(t, woke, 1, "a deadline set earlier than the head")
	})

	t.Run("repeats", func(t *testing.T) {
		woke := wakes(t, s, shard.Repeats)
		l := acquire(t, s, 2, "a")
		claim(s, shard.Repeats, 2, l) // empty: sleeps until wakeBy
		if _, _, err := s.Arm(ctx, shard.Repeats, 2, "r1", at(2*time.Hour), 0, true); err != nil {
			t.Fatal(err)
		}
		expectNoWake(t, woke, "a repeat armed after wakeBy")
		if _, _, err := s.Arm(ctx, shard.Repeats, 2, "r2", at(100*time.Millisecond), 0, true); err != nil {
			t.Fatal(err)
		}
		expectWake(t, woke, 2, "a repeat armed before wakeBy")
	})

	t.Run("timers", func(t *testing.T) {
		woke := wakes(t, s, shard.Timers)
		topo, err := shard.NewWatcher(ctx, s, 4, time.Hour, nil)
		if err != nil {
			t.Fatal(err)
		}
		w := shard.NewWriter(s, "w", topo.Current, topo.Refresh)
		ls := s.Leases("timers")
		l := acquire(t, ls, 3, "a")
		reset := func(deadline int64) {
			t.Helper()
			if err := w.ResetTimers(ctx, []shard.TimerReset{{Member: id("q/t", 3), Deadline: deadline, Set: true}}); err != nil {
				t.Fatal(err)
			}
		}
		reset(at(20 * time.Minute))
		claim(ls, shard.Timers, 3, l)
		reset(at(30 * time.Minute))
		expectNoWake(t, woke, "a timer moved later")
		reset(at(50 * time.Millisecond))
		expectWake(t, woke, 3, "a timer set before the head")
	})
}

// TestWakeCrossesClusterNodes proves the notice reaches a subscriber on
// another node of a Redis Cluster than the shard's master: the script
// publishes on the master of the shard's slot, the cluster broadcasts it.
func TestWakeCrossesClusterNodes(t *testing.T) {
	cluster := testenv.RedisClusterWith(t, servers.ClusterOptions{Masters: 3})
	s := testenv.StoreOn(t, cluster.Addrs, "sw")
	ctx := t.Context()
	const n = 16
	if _, err := s.InitTopology(ctx, n); err != nil {
		t.Fatal(err)
	}
	woke := wakes(t, s, shard.Deadlines)
	now := time.Now()
	for i := range n {
		l := acquire(t, s, i, "a")
		if _, err := s.Claim(ctx, shard.Deadlines, i, l, now.UnixMilli(), 10, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	for k, seen := 0, map[int]bool{}; len(seen) < n; k++ {
		id := fmt.Sprintf("d%d", k)
		i := shard.Of(id, n)
		if seen[i] {
			continue
		}
		seen[i] = true
		upsert(t, s, i, shard.Entry{ID: id, Deadline: now.Add(time.Minute).UnixMilli()})
		expectWake(t, woke, i, fmt.Sprintf("a new device in shard %d", i))
	}
}
