package guard_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/guard"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

func keep(*dispatch.DeviceRecord, bool) (bool, bool) { return false, false }

// rig is a guard on a real Redis and NATS, with the registry and the
// event stream it restores from.
type rig struct {
	env   *testenv.Env
	store *shard.Store
	pub   *dispatch.Bus
	reg   *dispatch.Registry
	thr   *shard.Thresholds
	g     *guard.Guard

	metrics *prometheus.Registry
}

func newRig(t *testing.T) *rig {
	env := testenv.New(t, testenv.Options{NATS: true})
	ctx := t.Context()
	pub, err := dispatch.New(ctx, env.Conn(t), dispatch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := pub.OpenRegistry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{env: env, store: env.Store(t, "sw"), pub: pub, reg: reg}
	r.thr = shard.NewThresholds(r.store, time.Minute, map[string]time.Duration{"meter": 2 * time.Minute})
	return r
}

func (r *rig) guard(t *testing.T) *guard.Guard {
	r.metrics = prometheus.NewRegistry()
	r.g = guard.New(guard.Options{Store: r.store, Registry: r.reg, Pub: r.pub, Thresholds: r.thr, Initial: 4,
		Checkpoint: 200 * time.Millisecond, Registerer: r.metrics, Log: slog.New(slog.DiscardHandler)})
	if err := r.g.Establish(t.Context()); err != nil {
		t.Fatal(err)
	}
	return r.g
}

// run runs g with a topology watcher until the returned stop is called.
func (r *rig) run(t *testing.T, g *guard.Guard) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	w, err := shard.NewWatcher(ctx, r.store, 4, 50*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.Watch(w, nil)
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	return func() { cancel(); <-done }
}

// add puts recs in the durable registry, leaving any record already
// there as it is.
func (r *rig) add(t *testing.T, recs []dispatch.DeviceRecord) {
	t.Helper()
	for _, err := range r.reg.Add(t.Context(), recs, keep) {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// empty kills Redis and starts it again without its data.
func (r *rig) empty(t *testing.T) {
	if err := r.env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) deadline(t *testing.T, topo shard.Topology, id string) (int64, bool) {
	sc, ok, err := r.store.Score(t.Context(), shard.Deadlines, shard.Of(id, topo.Shards), id)
	if err != nil {
		t.Fatal(err)
	}
	return sc, ok
}

// TestRestoreFromRegistryAndStream: after Redis comes back empty, a
// device the registry knows is watched again a full threshold (its own)
// from the restore; a device lost before is still lost, whether the
// registry already had its loss or only the event stream did; the
// topology is not lowered; every shard is vetted under a new generation.
func TestRestoreFromRegistryAndStream(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	g := r.guard(t)
	if _, err := r.store.Double(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	r.add(t, []dispatch.DeviceRecord{{ID: "live"}, {ID: "typed", Type: "meter"},
		{ID: "lost-in-registry", LostDeadline: 1000, LostAt: 1001}, {ID: "lost-in-stream"}, {ID: "came-back"}})
	// Redis holds the mark the registry has (a checkpoint copies it).
	if err := r.store.LostMarks().Mark(ctx, "lost-in-registry", 1000, 1001); err != nil {
		t.Fatal(err)
	}
	// The stream has a loss the registry has not caught up with, and a
	// loss followed by its recovery.
	var msgs []dispatch.Message
	for _, ev := range []dispatch.Event{
		dispatch.Lost{ID: "lost-in-stream@2000", Device: "lost-in-stream", Deadline: 2000, FiredAt: 2001},
		dispatch.Lost{ID: "came-back@3000", Device: "came-back", Deadline: 3000, FiredAt: 3001},
		dispatch.Recovered{ID: "came-back@3000/recovered", Device: "came-back", LostAt: 3000, RecoveredAt: 3500},
	} {
		m, err := dispatch.Encode(r.pub.Subjects(), ev)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	for _, err := range r.pub.Publish(ctx, msgs) {
		if err != nil {
			t.Fatal(err)
		}
	}
	topo, err := r.store.Topology(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The guard records the doubling in the registry on its next check.
	stop := r.run(t, g)
	testenv.WaitFor(t, 5*time.Second, "the doubling recorded in the registry", func() bool {
		m, _, err := r.reg.Meta(ctx)
		return err == nil && m.Shards == 8
	})

	before := time.Now()
	r.empty(t)
	testenv.WaitFor(t, 20*time.Second, "the restore", func() bool {
		ok, _ := g.Ready()
		gen, found, err := r.store.Beat(ctx, time.Now().UnixMilli())
		return ok && found && err == nil && gen.ID == r.store.Generation()
	})
	stop()

	after, err := r.store.Topology(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Shards != topo.Shards || after.Epoch <= topo.Epoch {
		t.Fatalf("topology after the restore %+v, want %d shards above epoch %d", after, topo.Shards, topo.Epoch)
	}
	if err := r.store.Vetted(ctx, after.Shards); err != nil {
		t.Fatalf("shards not vetted after the restore: %v", err)
	}
	for id, thr := range map[string]time.Duration{"live": time.Minute, "typed": 2 * time.Minute, "came-back": time.Minute} {
		d, ok := r.deadline(t, after, id)
		if !ok || time.UnixMilli(d).Before(before.Add(thr)) {
			t.Errorf("%s: deadline %v (watched %v), want a full threshold %v from the loss", id, time.UnixMilli(d), ok, thr)
		}
	}
	devs, err := r.store.Devices(ctx, []string{"typed", "lost-in-registry", "lost-in-stream", "came-back"})
	if err != nil {
		t.Fatal(err)
	}
	if devs[0].Type != "meter" {
		t.Errorf("typed device restored with type %q", devs[0].Type)
	}
	if devs[1].LostDeadline != 1000 || devs[2].LostDeadline != 2000 || devs[3].LostDeadline != 0 {
		t.Errorf("lost marks after the restore: %+v", devs[1:])
	}
	for _, id := range []string{"lost-in-registry", "lost-in-stream"} {
		if _, ok := r.deadline(t, after, id); ok {
			t.Errorf("%s is lost but was watched again", id)
		}
	}
	_, outages, err := r.store.Watermarks().Read(ctx)
	if err != nil || len(outages) == 0 {
		t.Fatalf("no outage recorded for the loss: %v %v", outages, err)
	}
}

// TestUpgradeFillsRegistry: an installation from before the durable
// registry (JSON registry entries, no generation) is recorded in the
// registry at the first start, and its types read back.
func TestUpgradeFillsRegistry(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.env.Redis.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := r.store.InitTopology(ctx, 4); err != nil {
		t.Fatal(err)
	}
	k := shard.NewKeys("sw")
	var cmds rueidis.Commands
	for j := range 50 {
		id := fmt.Sprintf("old-%d", j)
		cmds = append(cmds, rc.B().Zadd().Key(k.Timers(shard.Deadlines, shard.Of(id, 4))).ScoreMember().ScoreMember(float64(time.Now().Add(time.Hour).UnixMilli()), id).Build())
		if j%2 == 0 {
			cmds = append(cmds, rc.B().Hset().Key(fmt.Sprintf("sw:{r%d}:reg", shard.Part(id))).FieldValue().FieldValue(id, `{"t":"meter","f":1}`).Build())
		}
	}
	cmds = append(cmds, rc.B().Hset().Key(k.Lost("gone")).FieldValue().FieldValue("gone", "500:501").Build())
	for _, res := range rc.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			t.Fatal(err)
		}
	}
	r.guard(t)
	n := 0
	err = r.reg.Each(ctx, func(d dispatch.DeviceRecord) error {
		n++
		if d.ID == "old-0" && d.Type != "meter" || d.ID == "gone" && d.LostDeadline != 500 {
			t.Errorf("record %+v", d)
		}
		return nil
	})
	if err != nil || n != 51 {
		t.Fatalf("registry after the upgrade: %d records (%v), want 51", n, err)
	}
	types, err := r.store.Types(ctx, []string{"old-0", "old-1"})
	if err != nil || types[0] != "meter" || types[1] != "" {
		t.Fatalf("types after the upgrade: %q, %v", types, err)
	}
}

// TestCheckpointCopiesLostMarks: the lost marks Redis holds reach the
// registry at the next checkpoint, and a cleared mark is cleared there.
func TestCheckpointCopiesLostMarks(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	g := r.guard(t)
	r.add(t, []dispatch.DeviceRecord{{ID: "a"}, {ID: "b", LostDeadline: 7, LostAt: 8}})
	if err := r.store.LostMarks().Mark(ctx, "a", 1000, 1001); err != nil {
		t.Fatal(err)
	}
	defer r.run(t, g)()
	testenv.WaitFor(t, 10*time.Second, "the registry holding Redis's lost marks", func() bool {
		a, _, err1 := r.reg.Get(ctx, "a")
		b, _, err2 := r.reg.Get(ctx, "b")
		return err1 == nil && err2 == nil && a.LostDeadline == 1000 && a.LostAt == 1001 && b.LostDeadline == 0
	})
}

// TestNotReadyUntilRestored: from the moment a loss is seen until the data
// is restored the process says it is not ready, and why; the loss is
// counted and told on sigwatch.system.
func TestNotReadyUntilRestored(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	system := testenv.RecordStream[dispatch.System](t, r.env.Conn(t), "SIGWATCH", "sigwatch.system")
	g := r.guard(t)
	defer r.run(t, g)()
	if ok, why := g.Ready(); !ok {
		t.Fatalf("not ready before any loss: %s", why)
	}
	r.empty(t)
	// Another process holds the restore lock: this one waits, not ready.
	if ok, err := r.store.TakeLock(ctx, shard.RestoreLock, "someone-else", time.Hour); !ok || err != nil {
		t.Fatalf("lock: %v %v", ok, err)
	}
	testenv.WaitFor(t, 10*time.Second, "not ready, saying why", func() bool {
		ok, why := g.Ready()
		return !ok && strings.Contains(why, "generation record is missing")
	})
	if n := counterValue(t, r.metrics, "sigwatch_redis_data_loss_total"); n != 1 {
		t.Errorf("sigwatch_redis_data_loss_total %v, want 1", n)
	}
	if _, err := r.store.ExtendLock(ctx, shard.RestoreLock, "someone-else", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "ready again", func() bool { ok, _ := g.Ready(); return ok })
	system.WaitN(t, 10*time.Second, 2, "redis_data_loss and redis_restored", func(ev dispatch.System) bool {
		return ev.Kind == "redis_data_loss" || ev.Kind == "redis_restored"
	})
}

// counterValue reads the counter name from what reg gathers.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
