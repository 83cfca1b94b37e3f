package shard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestClaimRefusesUnvettedShard: a shard is claimed under a generation
// only while its layout carries that generation and the run id of the
// Redis process serving it; a restart (even one that kept every key) and
// a flush both make claims refuse with ErrDataLoss and tell OnDataLoss.
func TestClaimRefusesUnvettedShard(t *testing.T) {
	env := testenv.New(t, testenv.Options{RedisPersist: true})
	ctx, s := t.Context(), env.Store(t, "sw")
	now := time.Now().UnixMilli()
	if _, err := s.InitTopology(ctx, 2); err != nil {
		t.Fatal(err)
	}
	id, err := s.CreateGeneration(ctx, "g1", now)
	if err != nil || id != "g1" {
		t.Fatalf("create generation: %q, %v", id, err)
	}
	if again, _ := s.CreateGeneration(ctx, "g2", now); again != "g1" {
		t.Fatalf("a second create replaced the generation: %q", again)
	}
	if err := s.Vet(ctx, 2, "g1"); err != nil {
		t.Fatal(err)
	}
	s.SetGeneration("g1")
	var told int
	s.OnDataLoss(func(error) { told++ })
	upsert(t, s, 0, shard.Entry{ID: "a", Deadline: now})
	l := acquire(t, s, 0, "me")
	if c, err := s.Claim(ctx, shard.Deadlines, 0, l, now, 10, time.Now()); err != nil || len(c.Due) != 1 {
		t.Fatalf("claim of a vetted shard: %+v, %v", c, err)
	}
	if err := s.Vetted(ctx, 2); err != nil {
		t.Fatalf("vetted shards reported as not: %v", err)
	}

	// Another generation's process is refused.
	other := env.Store(t, "sw")
	other.SetGeneration("g0")
	if _, err := other.Claim(ctx, shard.Deadlines, 0, l, now, 10, time.Now()); !errors.Is(err, shard.ErrDataLoss) {
		t.Fatalf("claim under another generation: %v, want ErrDataLoss", err)
	}

	// Redis restarted with every key: the process serving the shard changed.
	if err := env.Redis.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the claim refused after the restart", func() bool {
		_, err := s.Claim(ctx, shard.Deadlines, 0, l, now, 10, time.Now()) // the lease was kept
		return errors.Is(err, shard.ErrDataLoss)
	})
	if told == 0 {
		t.Error("OnDataLoss was not told of the refused claim")
	}
	if err := s.Vetted(ctx, 2); !errors.Is(err, shard.ErrDataLoss) {
		t.Errorf("Vetted after a restart: %v, want ErrDataLoss", err)
	}
	if err := s.Vet(ctx, 2, "g1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Vetted(ctx, 2); err != nil {
		t.Errorf("Vetted after vetting again: %v", err)
	}
}

// TestUpsertRefusesNewIDsWithoutGeneration: after Redis lost everything, a
// writer under the old generation adds no id (an absent id is not new), and
// the ids Redis still holds are pushed forward as usual.
func TestUpsertRefusesNewIDsWithoutGeneration(t *testing.T) {
	ctx, s := newStore(t)
	now := time.Now().UnixMilli()
	if err := s.Vet(ctx, 1, "g1"); err != nil {
		t.Fatal(err)
	}
	upsert(t, s, 0, shard.Entry{ID: "old", Deadline: now})
	s.SetGeneration("g1")
	if _, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: {{ID: "old", Deadline: now + 10}}}); err != nil {
		t.Fatalf("push forward under the generation: %v", err)
	}
	if _, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: {{ID: "new", Deadline: now}}}); err != nil {
		t.Fatalf("add under the generation: %v", err)
	}
	s.SetGeneration("g2")
	_, err := s.Upsert(ctx, shard.Deadlines, map[int][]shard.Entry{0: {{ID: "newer", Deadline: now}, {ID: "old", Deadline: now + 20}}})
	if !errors.Is(err, shard.ErrDataLoss) {
		t.Fatalf("add under a generation the shard does not carry: %v, want ErrDataLoss", err)
	}
	if _, ok := score(t, s, 0, "newer"); ok {
		t.Error("an absent id was added to an unvetted shard")
	}
	if sc, _ := score(t, s, 0, "old"); sc != now+20 {
		t.Errorf("a present id was not pushed forward: %d, want %d", sc, now+20)
	}
}

// TestGenerationBeatSeesRollback: the beat's sequence only grows, so a
// record found at or below a sequence already seen is a rollback, and a
// missing one a loss.
func TestGenerationBeatSeesRollback(t *testing.T) {
	ctx, s := newStore(t)
	if _, ok, err := s.Beat(ctx, 1); ok || err != nil {
		t.Fatalf("beat without a record: ok %v, %v", ok, err)
	}
	if _, err := s.CreateGeneration(ctx, "g", 1); err != nil {
		t.Fatal(err)
	}
	a, _, _ := s.Beat(ctx, 2)
	b, _, _ := s.Beat(ctx, 3)
	if a.ID != "g" || b.Seq != a.Seq+1 || b.At != 2 {
		t.Fatalf("beats %+v then %+v", a, b)
	}
	if err := s.WriteGeneration(ctx, "g", 4); err != nil { // as a rollback would leave it
		t.Fatal(err)
	}
	if c, _, _ := s.Beat(ctx, 5); c.Seq > b.Seq {
		t.Fatalf("sequence after a rollback %d, want at most %d", c.Seq, b.Seq)
	}
}

// TestWatcherNeverLowersTopology: a topology read below the one a watcher
// holds is not adopted, and is reported.
func TestWatcherNeverLowersTopology(t *testing.T) {
	ctx, s := newStore(t)
	w, err := shard.NewWatcher(ctx, s, 4, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Double(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got, _ := w.Refresh(ctx); got.Shards != 8 {
		t.Fatalf("after a doubling the watcher holds %d shards", got.Shards)
	}
	var lower []shard.Topology
	w.OnLower(func(seen, read shard.Topology) { lower = append(lower, read) })
	if err := s.RestoreTopology(ctx, shard.Topology{Shards: 4, Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	got, err := w.Refresh(ctx)
	if err == nil || got.Shards != 8 || w.Current().Shards != 8 {
		t.Fatalf("a lower topology was adopted: %+v, %v", got, err)
	}
	if len(lower) != 1 || lower[0].Shards != 4 {
		t.Fatalf("OnLower told %+v, want the 4-shard topology", lower)
	}
}

// TestDoublingVetsNewShards: the shards a doubling adds are claimable under
// the generation at once.
func TestDoublingVetsNewShards(t *testing.T) {
	ctx, s := newStore(t)
	if _, err := s.InitTopology(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateGeneration(ctx, "g", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Vet(ctx, 2, "g"); err != nil {
		t.Fatal(err)
	}
	s.SetGeneration("g")
	if _, err := s.Double(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.Vetted(ctx, 4); err != nil {
		t.Fatalf("new shards not vetted: %v", err)
	}
}

// TestAlarmQueueDoublingVetsNewShards: the alarm's repeat queue shares the
// installation's generation, so its doubling vets its new shards too.
func TestAlarmQueueDoublingVetsNewShards(t *testing.T) {
	ctx, s := newStore(t)
	a := s.Sub("alarm")
	if _, err := a.InitTopology(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateGeneration(ctx, "g", 1); err != nil {
		t.Fatal(err)
	}
	if err := a.Vet(ctx, 2, "g"); err != nil {
		t.Fatal(err)
	}
	s.SetGeneration("g")
	if _, err := a.Double(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := a.Vetted(ctx, 4); err != nil {
		t.Fatalf("the alarm queue's new shards are not vetted: %v", err)
	}
}
