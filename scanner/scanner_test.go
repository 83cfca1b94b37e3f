package scanner

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
)

const threshold = time.Second

// harness is one test's Redis, NATS, store, publisher and event recorders.
type harness struct {
	t         *testing.T
	ctx       context.Context
	env       *testenv.Env
	nc        *nats.Conn
	store     *shard.Store
	topo      *shard.Watcher
	thr       *shard.Thresholds
	pub       *dispatch.Bus
	shards    int
	lost      *testenv.Recorder[dispatch.Lost]      // sigwatch.lost.> on core NATS
	recovered *testenv.Recorder[dispatch.Recovered] // sigwatch.recovered.> on core NATS
	regs      map[*Scanner]*prometheus.Registry     // each scanner's metrics
	before    testenv.LeakOption                    // the goroutines running once the harness is up
}

func newHarness(t *testing.T, shards int) *harness {
	t.Helper()
	return newHarnessOn(t, shards, nil)
}

// newHarnessOn is newHarness with Redis at addrs (a Redis Cluster's nodes),
// or the test environment's own Redis when addrs is empty.
func newHarnessOn(t *testing.T, shards int, addrs []string) *harness {
	t.Helper()
	env := testenv.New(t, testenv.Options{NATS: true})
	ctx := context.Background()
	store := env.Store(t, "sw")
	if len(addrs) > 0 {
		store = testenv.StoreOn(t, addrs, "sw")
	}
	topo, err := shard.NewWatcher(ctx, store, shards, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	nc := env.Conn(t, nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	pub, err := dispatch.New(ctx, nc, dispatch.Options{AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, ctx: ctx, env: env, nc: nc, store: store, topo: topo, thr: shard.NewThresholds(store, threshold, nil),
		pub: pub, shards: shards, regs: map[*Scanner]*prometheus.Registry{},
		lost:      testenv.Record[dispatch.Lost](t, nc, "sigwatch.lost.>"),
		recovered: testenv.Record[dispatch.Recovered](t, nc, "sigwatch.recovered.>"),
		before:    testenv.IgnoreCurrent()}
}

// scanner returns a scanner with test timings, its metrics registry, and
// opts changed by mod.
func (h *harness) scanner(replica string, mod func(*Options)) (*Scanner, *prometheus.Registry) {
	h.t.Helper()
	opts := Options{Replica: replica, Rebalance: 100 * time.Millisecond,
		Config: queue.Config{LeaseTTL: time.Second, Poll: 10 * time.Millisecond, Batch: 64}, Thresholds: h.thr}
	if mod != nil {
		mod(&opts)
	}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(h.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})).With("replica", replica)
	s, err := New(opts, h.store, h.topo, h.pub, reg, log)
	if err != nil {
		h.t.Fatal(err)
	}
	h.regs[s] = reg
	return s, reg
}

// run starts s and returns the function that stops it and waits for Run to
// return. The test's cleanup stops it too, if the test did not.
func (h *harness) run(s *Scanner) (stop func()) {
	ctx, cancel := context.WithCancel(h.ctx)
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					h.t.Errorf("Run returned %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				h.t.Errorf("Run did not return within 10s of cancellation")
			}
		})
	}
	h.t.Cleanup(stop)
	return stop
}

// advanceWatermark plays ingest: it moves the watermark to the clock every
// 5ms until the returned function is called.
func (h *harness) advanceWatermark() (stop func()) {
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go h.playIngest(ctx, done)
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	h.t.Cleanup(stop)
	return stop
}

// playIngest is advanceWatermark's goroutine; the leak check leaves it out.
func (h *harness) playIngest(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		h.store.Watermarks().Advance(ctx, time.Now().UnixMilli(), time.Hour)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// watchTopology runs the scanners' topology watcher until the returned
// function is called, as a process does while doublings happen.
func (h *harness) watchTopology() (stop func()) {
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() { defer close(done); h.topo.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	h.t.Cleanup(stop)
	return stop
}

// checkNoLeak fails if a goroutine started since the harness was up is
// still running, but for the watermark the harness plays for the whole
// test. Call it after every scanner of the test has stopped.
func (h *harness) checkNoLeak() {
	h.t.Helper()
	testenv.VerifyNone(h.t, h.before, testenv.IgnoreFuncs("github.com/sigwatch/sigwatch/scanner.(*harness).playIngest"))
}

// add puts entries into their shards.
func (h *harness) add(es ...shard.Entry) {
	h.t.Helper()
	by := map[int][]shard.Entry{}
	for _, e := range es {
		i := shard.Of(e.ID, h.shards)
		by[i] = append(by[i], e)
	}
	if _, err := h.store.Upsert(h.ctx, shard.Deadlines, by); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) score(id string) (int64, bool) {
	h.t.Helper()
	sc, ok, err := h.store.Score(h.ctx, shard.Deadlines, shard.Of(id, h.shards), id)
	if err != nil {
		h.t.Fatal(err)
	}
	return sc, ok
}

// streamLost counts the lost events stored in the stream under each id.
// JetStream drops a re-publish with a known Nats-Msg-Id, so this is what
// invariant 3 promises downstream.
func (h *harness) streamLost() map[string]int {
	h.t.Helper()
	return testenv.StreamMsgIDs(h.t, h.nc, "SIGWATCH", "sigwatch.lost.")
}

// sum is the number of messages counted in ids.
func sum(ids map[string]int) int {
	n := 0
	for _, c := range ids {
		n += c
	}
	return n
}

// storedTwice fails t for every id stored more than once in ids (counts
// from streamLost) and returns how many there are.
func storedTwice(t *testing.T, ids map[string]int) int {
	t.Helper()
	twice := 0
	for id, c := range ids {
		if c != 1 {
			twice++
			t.Errorf("stream: %d lost messages with id %s, want 1", c, id)
		}
	}
	return twice
}

// of matches the lost events of device id.
func of(id string) func(dispatch.Lost) bool {
	return func(l dispatch.Lost) bool { return l.Device == id }
}

// metric reads the counter or gauge name of s's registry.
func (h *harness) metric(s *Scanner, name string) float64 {
	h.t.Helper()
	return testenv.Gathered(h.t, h.regs[s], name)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// TestFiresOnceNeverEarly proves invariants 1 and 3: every deadline fires
// exactly once, never before it, and the fired entries leave their shards.
func TestFiresOnceNeverEarly(t *testing.T) {
	h := newHarness(t, 4)
	h.advanceWatermark()
	start := time.Now()
	const n = 300
	want := map[string]int64{}
	var es []shard.Entry
	for k := range n {
		e := shard.Entry{ID: fmt.Sprintf("dev-%03d", k), Deadline: start.Add(300*time.Millisecond + time.Duration(k)*10*time.Millisecond).UnixMilli()}
		es = append(es, e)
		want[e.ID] = e.Deadline
	}
	h.add(es...)
	s, _ := h.scanner("a", nil)
	stop := h.run(s)

	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%d lost events", n), func() bool { return h.lost.Len() >= n })
	testenv.Never(t, 100*time.Millisecond, "a lost event beyond one per deadline", func() bool { return h.lost.Len() > n })
	stop()
	h.checkNoLeak()

	got := h.lost.Events()
	if len(got) != n {
		t.Errorf("got %d lost events, want %d (one per deadline)", len(got), n)
	}
	seen := map[string]bool{}
	var lags, arrivals []time.Duration
	for _, g := range got {
		ev := g.Body
		if seen[ev.Device] {
			t.Errorf("%s fired twice", ev.Device)
		}
		seen[ev.Device] = true
		if ev.Deadline != want[ev.Device] {
			t.Errorf("%s: got deadline %d, want %d", ev.Device, ev.Deadline, want[ev.Device])
		}
		if ev.FiredAt < ev.Deadline || g.At.UnixMilli() < ev.Deadline {
			t.Errorf("%s fired early: fired_at %d, arrived %d, deadline %d", ev.Device, ev.FiredAt, g.At.UnixMilli(), ev.Deadline)
		}
		if ev.LastSeen != ev.Deadline-threshold.Milliseconds() || ev.Shard != shard.Of(ev.Device, 4) {
			t.Errorf("%s: got last_seen %d shard %d, want %d and %d", ev.Device, ev.LastSeen, ev.Shard, ev.Deadline-1000, shard.Of(ev.Device, 4))
		}
		if ev.ID != dispatch.LostID(ev.Device, ev.Deadline) || g.MsgID != ev.ID {
			t.Errorf("%s: got id %q, Nats-Msg-Id %q, want both %q", ev.Device, ev.ID, g.MsgID, dispatch.LostID(ev.Device, ev.Deadline))
		}
		lags = append(lags, time.Duration(ev.FiredAt-ev.Deadline)*time.Millisecond)
		arrivals = append(arrivals, g.At.Sub(time.UnixMilli(ev.Deadline)))
	}
	if len(lags) > 0 {
		t.Logf("fire lag (fired_at - deadline): p50 %v p99 %v; arrival lag: p50 %v p99 %v",
			percentile(lags, 0.5), percentile(lags, 0.99), percentile(arrivals, 0.5), percentile(arrivals, 0.99))
	}
	if distinct := h.streamLost(); sum(distinct) != n || len(distinct) != n {
		t.Errorf("stream holds %d lost messages with %d distinct ids, want %d and %d", sum(distinct), len(distinct), n, n)
	}
	for i := range 4 {
		if size, _ := h.store.Size(h.ctx, shard.Deadlines, i); size != 0 {
			t.Errorf("shard %d still holds %d entries, want 0", i, size)
		}
		if owner, _ := h.store.Owner(h.ctx, i); owner != "" {
			t.Errorf("shard %d lease %q after shutdown, want released", i, owner)
		}
	}
	devs, err := h.store.Devices(h.ctx, []string{"dev-000"})
	if err != nil || devs[0].LostDeadline != want["dev-000"] {
		t.Errorf("registry of dev-000: got %+v (%v), want lost at %d", devs, err, want["dev-000"])
	}
	if got := h.metric(s, "sigwatch_scanner_lost_total"); got != n {
		t.Errorf("lost_total = %v, want %d", got, n)
	}
	if c := h.metric(s, "sigwatch_scanner_fire_lag_seconds"); c != n {
		t.Errorf("fire_lag_seconds holds %v observations, want %d", c, n)
	}
}

// TestResetBetweenClaimAndSettleSurvives proves invariant 4 through the
// scanner: a reset (ZADD GT) that lands after the claim and the publish
// survives the settle with its new deadline, and the device, already
// announced lost, is announced recovered.
func TestResetBetweenClaimAndSettleSurvives(t *testing.T) {
	h := newHarness(t, 1)
	h.advanceWatermark()
	deadline := time.Now().Add(-50 * time.Millisecond).UnixMilli()
	reset := time.Now().Add(time.Hour).UnixMilli()
	h.add(shard.Entry{ID: "dev", Deadline: deadline})
	s, _ := h.scanner("a", nil)
	var resets atomic.Int32
	s.afterPublish = func(i int) {
		if resets.Add(1) == 1 {
			h.add(shard.Entry{ID: "dev", Deadline: reset})
		}
	}
	stop := h.run(s)
	testenv.WaitFor(t, 5*time.Second, "a recovered event", func() bool { return h.recovered.Len() > 0 })
	stop()
	h.checkNoLeak()

	if got := h.lost.Bodies(of("dev")); len(got) != 1 || got[0].Deadline != deadline {
		t.Errorf("got lost events %+v, want one at %d", got, deadline)
	}
	if sc, ok := h.score("dev"); !ok || sc != reset {
		t.Errorf("got score %d (present %v), want the reset deadline %d", sc, ok, reset)
	}
	want := dispatch.Recovered{ID: dispatch.RecoveredID("dev", deadline), Device: "dev", LostAt: deadline,
		RecoveredAt: reset - threshold.Milliseconds()}
	if got := h.recovered.Bodies(nil); len(got) != 1 || got[0] != want {
		t.Errorf("got recovered %+v, want [%+v]", got, want)
	}
	devs, _ := h.store.Devices(h.ctx, []string{"dev"})
	if devs[0].LostDeadline != 0 {
		t.Errorf("registry lost mark %d, want cleared", devs[0].LostDeadline)
	}
	if got := h.metric(s, "sigwatch_scanner_revived_total"); got != 1 {
		t.Errorf("revived_total = %v, want 1", got)
	}
}

// TestStolenLeaseChangesNothing proves invariant 5 through the scanner: once
// its lease is taken by another owner, a scanner can neither settle the batch
// it claimed nor claim again; its loop stops and nothing is removed.
func TestStolenLeaseChangesNothing(t *testing.T) {
	h := newHarness(t, 1)
	h.advanceWatermark()
	first := time.Now().Add(-50 * time.Millisecond).UnixMilli()
	h.add(shard.Entry{ID: "first", Deadline: first})
	s, _ := h.scanner("a", nil)
	var thief shard.Lease
	var steals atomic.Int32
	s.afterPublish = func(i int) {
		if steals.Add(1) != 1 {
			return
		}
		// The lease expires while the batch is in flight and another
		// replica takes the shard.
		v, err := h.store.Owner(h.ctx, 0)
		if err == nil {
			err = h.store.Release(h.ctx, shard.Lease{Shard: 0, Value: v})
		}
		if err != nil {
			t.Error(err)
		}
		l, ok, err := h.store.Acquire(h.ctx, 0, "thief", time.Minute)
		if err != nil || !ok {
			t.Errorf("thief acquire: ok %v err %v", ok, err)
		}
		thief = l
	}
	stop := h.run(s)
	testenv.WaitFor(t, 5*time.Second, "the scanner to give shard 0 up", func() bool {
		return steals.Load() > 0 && len(s.Owned()) == 0
	})
	// A new due entry: the old owner must not claim it.
	late := time.Now().Add(-10 * time.Millisecond).UnixMilli()
	h.add(shard.Entry{ID: "late", Deadline: late})
	testenv.Never(t, 300*time.Millisecond, "late fired by a scanner without the lease", func() bool { // several polls and rebalances
		return len(h.lost.Bodies(of("late"))) > 0
	})
	stop()
	h.checkNoLeak()

	if sc, ok := h.score("first"); !ok || sc != first {
		t.Errorf("first: got score %d (present %v), want %d: a fenced settle removed it", sc, ok, first)
	}
	if sc, ok := h.score("late"); !ok || sc != late {
		t.Errorf("late: got score %d (present %v), want %d", sc, ok, late)
	}
	if got := h.metric(s, "sigwatch_scanner_lease_lost_total"); got != 1 {
		t.Errorf("lease_lost_total = %v, want 1", got)
	}
	if v, _ := h.store.Owner(h.ctx, 0); v != thief.Value {
		t.Errorf("owner %q after the old owner stopped, want the thief's %q untouched", v, thief.Value)
	}
}

// TestTwoReplicasSplitAndTakeOver proves ownership: two replicas split 16
// shards 8/8; when one stops, the other owns all 16 within LeaseTTL +
// Rebalance; and across the hand-over every deadline fires exactly once in
// the stream (invariants 2 and 3).
func TestTwoReplicasSplitAndTakeOver(t *testing.T) {
	h := newHarness(t, 16)
	h.advanceWatermark()
	start := time.Now()
	const n = 400
	var es []shard.Entry
	for k := range n {
		es = append(es, shard.Entry{ID: fmt.Sprintf("dev-%03d", k), Deadline: start.Add(500*time.Millisecond + time.Duration(k)*6*time.Millisecond).UnixMilli()})
	}
	h.add(es...)
	a, _ := h.scanner("a", nil)
	b, _ := h.scanner("b", nil)
	stopA := h.run(a)
	stopB := h.run(b)

	testenv.WaitFor(t, 3*time.Second, "an 8/8 split", func() bool {
		oa, ob := a.Owned(), b.Owned()
		return len(oa) == 8 && len(ob) == 8 && len(slices.Compact(slices.Sorted(slices.Values(append(oa, ob...))))) == 16
	})
	t.Logf("split: a %v, b %v", a.Owned(), b.Owned())

	// Stop b while deadlines are firing.
	testenv.WaitFor(t, 5*time.Second, "firing to be under way", func() bool { return h.lost.Len() > n/4 })
	stopped := time.Now()
	stopB()
	bound := a.opts.LeaseTTL + a.opts.Rebalance
	testenv.WaitFor(t, bound, "a to own all 16 shards", func() bool { return len(a.Owned()) == 16 })
	t.Logf("a owned all shards %v after b was told to stop", time.Since(stopped).Round(time.Millisecond))

	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%d distinct lost ids in the stream", n), func() bool {
		return len(h.streamLost()) >= n
	})
	testenv.Never(t, 100*time.Millisecond, "a lost event beyond one per deadline", func() bool { return len(h.lost.MsgIDs()) > n })
	stopA()
	h.checkNoLeak()

	distinct := h.streamLost()
	if sum(distinct) != n || len(distinct) != n {
		t.Errorf("stream holds %d lost messages with %d distinct ids, want %d and %d", sum(distinct), len(distinct), n, n)
	}
	for _, e := range es {
		if distinct[dispatch.LostID(e.ID, e.Deadline)] != 1 {
			t.Errorf("%s: %d stream messages for its deadline, want 1", e.ID, distinct[dispatch.LostID(e.ID, e.Deadline)])
		}
	}
	t.Logf("core subscription saw %d lost messages", h.lost.Len())
	live, _ := h.store.Heartbeat(h.ctx, "probe", time.Now(), time.Millisecond)
	if slices.Contains(live, "a") || slices.Contains(live, "b") {
		t.Errorf("live replicas %v after both stopped, want a and b gone", live)
	}
}

// TestDeadReplicaShardsTakenOver proves invariant 2 across a crash: shards
// leased by a replica that died without releasing them are taken over within
// about the lease time, and their expiries fire.
func TestDeadReplicaShardsTakenOver(t *testing.T) {
	h := newHarness(t, 16)
	h.advanceWatermark()
	const ttl = time.Second
	// The ghost heartbeats once and takes its shards, then dies.
	died := time.Now()
	if _, err := h.store.Heartbeat(h.ctx, "ghost", died, ttl); err != nil {
		t.Fatal(err)
	}
	ghostShards := shard.Assign(16, []string{"a", "ghost"}, "ghost")
	for _, i := range ghostShards {
		if _, ok, err := h.store.Acquire(h.ctx, i, "ghost", ttl); err != nil || !ok {
			t.Fatalf("ghost acquire %d: %v %v", i, ok, err)
		}
	}
	var es []shard.Entry
	for k := range 64 {
		es = append(es, shard.Entry{ID: fmt.Sprintf("dev-%02d", k), Deadline: died.Add(-time.Duration(k) * time.Millisecond).UnixMilli()})
	}
	h.add(es...)
	a, _ := h.scanner("a", nil)
	stop := h.run(a)

	testenv.WaitFor(t, ttl+2*a.opts.Rebalance+200*time.Millisecond, "a to own all 16 shards", func() bool { return len(a.Owned()) == 16 })
	t.Logf("took over the dead replica's shards %v after its last heartbeat", time.Since(died).Round(time.Millisecond))
	testenv.WaitFor(t, 5*time.Second, "every expiry to fire", func() bool { return h.lost.Len() >= len(es) })
	stop()
	h.checkNoLeak()
	if distinct := h.streamLost(); sum(distinct) != len(es) || len(distinct) != len(es) {
		t.Errorf("stream holds %d lost messages with %d distinct ids, want %d and %d", sum(distinct), len(distinct), len(es), len(es))
	}
}

// TestOutageDefersInsteadOfFiring proves invariant 6: nothing fires past a
// stalled watermark, and after a jump that records an outage, a device whose
// silence window overlapped the outage is deferred to a threshold after it,
// not fired; a device whose window did not overlap fires.
func TestOutageDefersInsteadOfFiring(t *testing.T) {
	h := newHarness(t, 1)
	const gap = 200 * time.Millisecond
	t0 := time.Now().UnixMilli()
	if _, err := h.store.Watermarks().Advance(h.ctx, t0, gap); err != nil {
		t.Fatal(err)
	}
	h.add(shard.Entry{ID: "before", Deadline: t0 - 100}, shard.Entry{ID: "b", Deadline: t0 + 300}, shard.Entry{ID: "c", Deadline: t0 + 600})
	s, _ := h.scanner("a", nil)
	stop := h.run(s)

	testenv.WaitFor(t, 3*time.Second, "the device due before the watermark to fire", func() bool { return len(h.lost.Bodies(of("before"))) == 1 })
	// The watermark stalls at t0 while the clock passes b's and c's deadlines.
	testenv.Never(t, time.Until(time.UnixMilli(t0+800)), "b or c fired past the stalled watermark", func() bool {
		return len(h.lost.Bodies(of("b")))+len(h.lost.Bodies(of("c"))) > 0
	})

	// Ingest comes back: the watermark jumps and the gap becomes an outage.
	t1 := time.Now().UnixMilli()
	if _, err := h.store.Watermarks().Advance(h.ctx, t1, gap); err != nil {
		t.Fatal(err)
	}
	if _, outs, _ := h.store.Watermarks().Read(h.ctx); !slices.Equal(outs, []shard.Outage{{Start: t0, End: t1}}) {
		t.Fatalf("got outages %v, want [%d:%d]", outs, t0, t1)
	}
	// A device silent since long before the outage is not protected by it.
	h.add(shard.Entry{ID: "e", Deadline: t0 - 200})
	wantDeferred := t1 + threshold.Milliseconds()
	testenv.WaitFor(t, 3*time.Second, "b and c to be deferred", func() bool {
		sb, _ := h.score("b")
		sc, _ := h.score("c")
		return sb == wantDeferred && sc == wantDeferred
	})
	testenv.WaitFor(t, 3*time.Second, "e to fire", func() bool { return len(h.lost.Bodies(of("e"))) == 1 })
	for _, id := range []string{"b", "c"} {
		if got := h.lost.Bodies(of(id)); len(got) != 0 {
			t.Errorf("%s fired although its silence overlapped the outage: %+v", id, got)
		}
	}
	if got := h.metric(s, "sigwatch_scanner_deferred_total"); got != 2 {
		t.Errorf("deferred_total = %v, want 2", got)
	}

	// Still silent a threshold after the outage: now they are lost.
	h.advanceWatermark()
	testenv.WaitFor(t, 5*time.Second, "b and c to fire after the deferral", func() bool {
		return len(h.lost.Bodies(of("b"))) == 1 && len(h.lost.Bodies(of("c"))) == 1
	})
	stop()
	h.checkNoLeak()
	for _, id := range []string{"b", "c"} {
		ev := h.lost.Bodies(of(id))[0]
		if ev.Deadline != wantDeferred || ev.LastSeen != t1 || ev.FiredAt < wantDeferred {
			t.Errorf("%s: got deadline %d last_seen %d fired_at %d, want %d, %d and not before the deadline",
				id, ev.Deadline, ev.LastSeen, ev.FiredAt, wantDeferred, t1)
		}
	}
}

// TestWatermarkWakesWaitingShard proves that a shard whose head is due by
// the clock but not yet by the watermark never fires before the watermark
// passes it (invariant 6), and is claimed again as soon as a later
// watermark is read, not a poll later: with a poll of a minute, the device
// still fires within the test's wait.
func TestWatermarkWakesWaitingShard(t *testing.T) {
	h := newHarness(t, 1)
	t0 := time.Now().UnixMilli()
	if _, err := h.store.Watermarks().Advance(h.ctx, t0, time.Hour); err != nil {
		t.Fatal(err)
	}
	h.add(shard.Entry{ID: "w", Deadline: t0 + 50})
	s, _ := h.scanner("a", func(o *Options) { o.Poll = time.Minute })
	stop := h.run(s)
	testenv.WaitFor(t, 3*time.Second, "the scanner to own the shard", func() bool { return len(s.Owned()) == 1 })
	testenv.Never(t, time.Until(time.UnixMilli(t0+300)), "w fired past the stalled watermark", func() bool {
		return len(h.lost.Bodies(of("w"))) > 0
	})
	wm := time.Now().UnixMilli()
	if _, err := h.store.Watermarks().Advance(h.ctx, wm, time.Hour); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "w to fire once the watermark passed it", func() bool { return len(h.lost.Bodies(of("w"))) == 1 })
	stop()
	h.checkNoLeak()
}

// TestNoWatermarkFiresNothing proves invariant 6 before ingest ever ran:
// with no watermark nothing is known to be silent, so nothing fires.
func TestNoWatermarkFiresNothing(t *testing.T) {
	h := newHarness(t, 2)
	past := time.Now().Add(-time.Minute).UnixMilli()
	h.add(shard.Entry{ID: "x", Deadline: past}, shard.Entry{ID: "y", Deadline: past + 1})
	s, _ := h.scanner("a", nil)
	stop := h.run(s)
	testenv.WaitFor(t, 3*time.Second, "the scanner to own both shards", func() bool { return len(s.Owned()) == 2 })
	testenv.Never(t, 300*time.Millisecond, "a lost event with no watermark", func() bool { return h.lost.Len() > 0 }) // many polls
	for _, id := range []string{"x", "y"} {
		if _, ok := h.score(id); !ok {
			t.Errorf("%s removed with no watermark, want kept", id)
		}
	}
	// The scanner was alive all along: once ingest runs, both fire.
	h.advanceWatermark()
	testenv.WaitFor(t, 3*time.Second, "both to fire once a watermark exists", func() bool { return h.lost.Len() == 2 })
	stop()
	h.checkNoLeak()
}

// TestNATSOutageLosesNothing proves invariants 2 and 3 across a NATS outage:
// expiries that cannot be published stay in their shard and are retried, and
// once NATS is back each fires, once in the stream even though messages
// buffered during the outage are delivered as well.
func TestNATSOutageLosesNothing(t *testing.T) {
	h := newHarness(t, 2)
	h.advanceWatermark()
	s, _ := h.scanner("a", nil)
	stop := h.run(s)
	testenv.WaitFor(t, 3*time.Second, "the scanner to own both shards", func() bool { return len(s.Owned()) == 2 })
	// One expiry per shard first: a shard publishes only once it has fenced
	// its lease on the stream, which needs NATS.
	var warm []shard.Entry
	for k := 0; len(warm) < 2; k++ {
		id := fmt.Sprintf("warm-%d", k)
		if shard.Of(id, 2) == len(warm) {
			warm = append(warm, shard.Entry{ID: id, Deadline: time.Now().UnixMilli()})
		}
	}
	h.add(warm...)
	testenv.WaitFor(t, 5*time.Second, "both shards fenced and firing", func() bool { return len(h.streamLost()) == 2 })

	h.env.NATS.Shutdown()
	const n = 20
	var es []shard.Entry
	for k := range n {
		es = append(es, shard.Entry{ID: fmt.Sprintf("dev-%02d", k), Deadline: time.Now().Add(50 * time.Millisecond).UnixMilli()})
	}
	h.add(es...)
	testenv.WaitFor(t, 5*time.Second, "publish errors", func() bool { return h.metric(s, "sigwatch_scanner_publish_errors_total") > 0 })
	for _, e := range es {
		if sc, ok := h.score(e.ID); !ok || sc != e.Deadline {
			t.Errorf("%s: got score %d (present %v) during the outage, want %d kept", e.ID, sc, ok, e.Deadline)
		}
	}

	if err := h.env.NATS.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "every expiry in the stream and out of its shard", func() bool {
		s0, _ := h.store.Size(h.ctx, shard.Deadlines, 0)
		s1, _ := h.store.Size(h.ctx, shard.Deadlines, 1)
		return len(h.streamLost()) == n+len(warm) && s0+s1 == 0
	})
	stop()
	h.checkNoLeak()
	if distinct := h.streamLost(); sum(distinct) != n+len(warm) || len(distinct) != n+len(warm) {
		t.Errorf("stream holds %d lost messages with %d distinct ids, want %d and %d", sum(distinct), len(distinct), n+len(warm), n+len(warm))
	}
	t.Logf("publish errors during the outage: %v", h.metric(s, "sigwatch_scanner_publish_errors_total"))
}
