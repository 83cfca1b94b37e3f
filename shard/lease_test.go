package shard_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestFencing proves invariant 5: once a lease has moved to another owner,
// the old holder can neither claim, settle nor renew, and nothing changes.
func TestFencing(t *testing.T) {
	ctx, s := newStore(t)
	upsert(t, s, 1, shard.Entry{"x", 100}, shard.Entry{"y", 200})
	old := acquire(t, s, 1, "a")

	if _, ok, err := s.Acquire(ctx, 1, "b", time.Minute); ok || err != nil {
		t.Fatalf("second acquire: got ok %v err %v, want refused while held", ok, err)
	}
	// The lease expires (here: deleted) and b takes it.
	if err := s.ExpireLease(ctx, 1); err != nil {
		t.Fatal(err)
	}
	cur := acquire(t, s, 1, "b")
	if cur.Token() <= old.Token() {
		t.Errorf("got token %d after %d, want a larger one", cur.Token(), old.Token())
	}

	if _, err := s.Claim(ctx, shard.Deadlines, 1, old, 1000, 10, time.Now()); !errors.Is(err, shard.ErrNotOwner) {
		t.Errorf("claim with the old lease: got %v, want ErrNotOwner", err)
	}
	if _, err := s.Settle(ctx, shard.Deadlines, 1, old, []shard.Entry{{"x", 100}}, []shard.Move{{ID: "y", From: 200, To: 5000}}); !errors.Is(err, shard.ErrNotOwner) {
		t.Errorf("settle with the old lease: got %v, want ErrNotOwner", err)
	}
	if err := s.Renew(ctx, old, time.Minute); !errors.Is(err, shard.ErrNotOwner) {
		t.Errorf("renew of the old lease: got %v, want ErrNotOwner", err)
	}
	if err := s.Release(ctx, old); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Owner(ctx, 1); v != cur.Value {
		t.Errorf("after the old holder's release: owner %q, want %q (untouched)", v, cur.Value)
	}
	if got, ok := score(t, s, 1, "x"); !ok || got != 100 {
		t.Errorf("x: got %d (present %v), want 100 untouched", got, ok)
	}
	if got, ok := score(t, s, 1, "y"); !ok || got != 200 {
		t.Errorf("y: got %d (present %v), want 200 untouched", got, ok)
	}

	if err := s.Release(ctx, cur); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Owner(ctx, 1); v != "" {
		t.Errorf("after release: owner %q, want free", v)
	}
}

// TestLeaseExpires proves a lease that is not renewed frees the shard, so a
// dead replica's shards can be taken over within the lease time.
func TestLeaseExpires(t *testing.T) {
	ctx, s := newStore(t)
	l, ok, err := s.Acquire(ctx, 0, "a", 200*time.Millisecond)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := s.Renew(ctx, l, 200*time.Millisecond); err != nil {
		t.Fatalf("renew: %v", err)
	}
	testenv.WaitFor(t, 2*time.Second, "the lease to expire", func() bool {
		_, ok, err := s.Acquire(ctx, 0, "b", time.Minute)
		return err == nil && ok
	})
}

// TestHeartbeatMembership proves live replicas are listed sorted, a silent
// one drops out after its ttl, and Leave removes one at once.
func TestHeartbeatMembership(t *testing.T) {
	ctx, s := newStore(t)
	now := time.UnixMilli(1_700_000_000_000)
	for _, r := range []string{"c", "a"} {
		if _, err := s.Heartbeat(ctx, r, now, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	live, err := s.Heartbeat(ctx, "b", now.Add(time.Second), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c"}; !slices.Equal(live, want) {
		t.Errorf("got live %v, want %v", live, want)
	}
	live, _ = s.Heartbeat(ctx, "b", now.Add(5500*time.Millisecond), 5*time.Second)
	if want := []string{"b"}; !slices.Equal(live, want) {
		t.Errorf("after a and c went silent: got %v, want %v", live, want)
	}
	if err := s.Leave(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	live, _ = s.Heartbeat(ctx, "d", now.Add(6*time.Second), 5*time.Second)
	if want := []string{"d"}; !slices.Equal(live, want) {
		t.Errorf("after b left: got %v, want %v", live, want)
	}
}
