package scanner

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// The doubling tests drive a live system through shard doublings: writers
// (shard.Writer, as ingest writes) reset thousands of devices continuously,
// each device written by whichever writer happens to get it (as members of
// a shared subscription do), while a silencer stops a random device every
// few tens of milliseconds. What must hold, read from the JetStream stream:
// exactly the silenced devices are reported lost, each once, at the last
// deadline written for it, and never before it.

// fleetLoad is the writers, the silencer and what they wrote.
type fleetLoad struct {
	t   *testing.T
	h   *harness
	ids []string

	mu      sync.Mutex
	silent  map[string]bool
	last    map[string]int64 // the latest deadline written for each device
	stopped bool
	// round is read-held by a round of writes from the moment it picks its
	// devices until they are stored, so silenced can wait for a round that
	// picked a device just before it went silent.
	round sync.RWMutex

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// laggingView is a writer's view of the topology that adopts a new epoch
// only lag after its watcher saw it: an ingest replica that lags behind.
type laggingView struct {
	w   *shard.Watcher
	lag time.Duration

	mu       sync.Mutex
	shown    shard.Topology
	pending  time.Time // when a newer epoch was first seen, zero if none
	switched []adopted // when the view adopted each newer epoch
}

type adopted struct {
	at   time.Time
	topo shard.Topology
}

func (v *laggingView) current() shard.Topology {
	t := v.w.Current()
	v.mu.Lock()
	defer v.mu.Unlock()
	if t.Epoch > v.shown.Epoch {
		now := time.Now()
		if v.pending.IsZero() {
			v.pending = now
		}
		if now.Sub(v.pending) >= v.lag {
			v.shown, v.pending = t, time.Time{}
			v.switched = append(v.switched, adopted{now, t})
		}
	}
	return v.shown
}

// adoptedShards returns when the view first adopted a topology of n shards
// or more.
func (v *laggingView) adoptedShards(n int) (time.Time, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, a := range v.switched {
		if a.topo.Shards >= n {
			return a.at, true
		}
	}
	return time.Time{}, false
}

func (v *laggingView) switches() []adopted {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.switched)
}

// startLoad starts writers writing devices and a silencer. lags[k] makes
// writer k adopt each new topology that long after it is published.
func startLoad(t *testing.T, h *harness, devices int, lags []time.Duration) (*fleetLoad, []*laggingView) {
	t.Helper()
	ctx, cancel := context.WithCancel(h.ctx)
	l := &fleetLoad{t: t, h: h, silent: map[string]bool{}, last: map[string]int64{}, cancel: cancel}
	for k := range devices {
		l.ids = append(l.ids, fmt.Sprintf("dev-%05d", k))
	}
	var (
		views   []*laggingView
		writers []*shard.Writer
	)
	for k, lag := range lags {
		// Each writer has its own watcher, as each ingest process does.
		w, err := shard.NewWatcher(ctx, h.store, h.shards, 500*time.Millisecond, nil)
		if err != nil {
			t.Fatal(err)
		}
		v := &laggingView{w: w, lag: lag, shown: w.Current()}
		views = append(views, v)
		wr := shard.NewWriter(h.store, fmt.Sprintf("writer-%d", k), v.current, w.Refresh)
		writers = append(writers, wr)
		l.wg.Go(func() { w.Run(ctx) })
		l.wg.Go(func() { wr.Run(ctx, nil, nil) })
	}
	l.wg.Go(func() { l.write(ctx, writers) })
	l.wg.Go(func() { l.silence(ctx) })
	t.Cleanup(l.stop)
	return l, views
}

// loadThreshold is the silence a device is allowed in the doubling tests.
// It is longer than the harness's threshold so that a slow round of writes
// (race detector, Redis Cluster, two cores) is not taken for a silence.
const loadThreshold = 2 * time.Second

// write resets every device that is not silent every 50-100ms, each
// through a writer picked at random (as members of a shared subscription
// split the stream), with deadlines on a 50ms grid so that a device's old
// and new shard often get the same deadline.
func (l *fleetLoad) write(ctx context.Context, ws []*shard.Writer) {
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	for ctx.Err() == nil {
		dl := time.Now().Add(loadThreshold).UnixMilli() / 50 * 50
		parts := make([][]shard.Entry, len(ws))
		l.round.RLock()
		l.mu.Lock()
		for _, id := range l.ids {
			if !l.silent[id] {
				k := rng.IntN(len(ws))
				parts[k] = append(parts[k], shard.Entry{ID: id, Deadline: dl})
			}
		}
		l.mu.Unlock()
		var wg sync.WaitGroup
		for k, w := range ws {
			wg.Go(func() {
				if _, err := w.Upsert(ctx, shard.Deadlines, parts[k], nil); err != nil {
					if ctx.Err() == nil {
						l.t.Errorf("writer %s: %v", w.Name(), err)
					}
					return
				}
				l.mu.Lock()
				for _, e := range parts[k] {
					l.last[e.ID] = max(l.last[e.ID], e.Deadline)
				}
				l.mu.Unlock()
			})
		}
		wg.Wait()
		l.round.RUnlock()
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(50+rng.IntN(50)) * time.Millisecond):
		}
	}
}

// silence silences one random device every 20-60ms until stopSilencing.
// A silenced device is never written again.
func (l *fleetLoad) silence(ctx context.Context) {
	rng := rand.New(rand.NewPCG(99, uint64(time.Now().UnixNano())))
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(20+rng.IntN(40)) * time.Millisecond):
		}
		l.mu.Lock()
		if l.stopped {
			l.mu.Unlock()
			return
		}
		// Only a device that was written can go silent; one never written
		// is not watched.
		if id := l.ids[rng.IntN(len(l.ids))]; l.last[id] != 0 {
			l.silent[id] = true
		}
		l.mu.Unlock()
	}
}

func (l *fleetLoad) stopSilencing() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
}

func (l *fleetLoad) stop() { l.cancel(); l.wg.Wait() }

// written returns the last deadline written for each device.
func (l *fleetLoad) written() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.last)
}

// silenced returns the silenced devices and the last deadline written for
// each. It waits for a round of writes in flight: one that picked a device
// before it went silent stores that device's last deadline.
func (l *fleetLoad) silenced() map[string]int64 {
	l.round.Lock()
	defer l.round.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int64, len(l.silent))
	for id := range l.silent {
		out[id] = l.last[id]
	}
	return out
}

// double starts a doubling and waits until it has drained.
func (h *harness) double(t *testing.T, within time.Duration) (started, finished time.Time) {
	t.Helper()
	before, _ := h.store.Topology(h.ctx)
	started = time.Now()
	got, err := h.store.Double(h.ctx, started)
	if err != nil {
		t.Fatal(err)
	}
	if got.Shards != 2*before.Shards || got.Prev != before.Shards {
		t.Fatalf("double: got %+v after %+v, want twice the shards", got, before)
	}
	if _, err := h.store.Double(h.ctx, started); err == nil || !strings.Contains(err.Error(), "still draining") {
		t.Errorf("double while draining: got %v, want a refusal", err)
	}
	testenv.WaitFor(t, within, fmt.Sprintf("the doubling to %d shards to drain", got.Shards), func() bool {
		cur, err := h.store.Topology(h.ctx)
		return err == nil && cur.Prev == 0 && cur.Shards == got.Shards
	})
	finished = time.Now()
	t.Logf("doubled %d -> %d; drained in %v", before.Shards, got.Shards, finished.Sub(started).Round(time.Millisecond))
	return started, finished
}

// checkLost proves invariants 1, 2 and 3 at the JetStream level: the stream
// holds one lost message per silenced device and none for any other, each at
// the last deadline written for the device, with Nats-Msg-Id its event id,
// and no event was fired before its deadline.
func checkLost(t *testing.T, h *harness, want, last map[string]int64) {
	t.Helper()
	distinct := h.streamLost()
	perDevice := map[string]int{}
	for id, n := range distinct {
		dev, _, _ := strings.Cut(id, "@")
		perDevice[dev] += n
		if n != 1 {
			t.Errorf("stream: %d messages with id %s, want 1", n, id)
		}
	}
	for dev, dl := range want {
		if perDevice[dev] != 1 || distinct[dispatch.LostID(dev, dl)] != 1 {
			t.Errorf("%s (silenced, last deadline %d): %d lost messages, %d at its last deadline; want exactly 1 at it",
				dev, dl, perDevice[dev], distinct[dispatch.LostID(dev, dl)])
		}
	}
	for dev, n := range perDevice {
		if _, ok := want[dev]; !ok {
			var evs []string
			for _, ev := range h.lost.Bodies(of(dev)) {
				evs = append(evs, fmt.Sprintf("deadline %d fired_at %d shard %d", ev.Deadline, ev.FiredAt, ev.Shard))
			}
			t.Errorf("%s was never silenced but fired %d times: an early fire (%s; last written %d)", dev, n, strings.Join(evs, ", "), last[dev])
		}
	}
	if msgs := sum(distinct); msgs != len(want) {
		t.Errorf("stream holds %d lost messages, want %d (one per silenced device)", msgs, len(want))
	}
	for _, g := range h.lost.Events() {
		if g.Body.FiredAt < g.Body.Deadline || g.At.UnixMilli() < g.Body.Deadline {
			t.Errorf("%s fired early: fired_at %d, arrived %d, deadline %d", g.Body.Device, g.Body.FiredAt, g.At.UnixMilli(), g.Body.Deadline)
		}
	}
}

// waitAllLost waits until every silenced device is in the stream, then
// watches a little longer for early fires and second fires: an event id
// beyond one per silenced device.
func waitAllLost(t *testing.T, h *harness, l *fleetLoad) map[string]int64 {
	t.Helper()
	l.stopSilencing()
	want := l.silenced()
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%d silenced devices in the stream", len(want)), func() bool {
		return len(h.streamLost()) >= len(want)
	})
	testenv.Never(t, 300*time.Millisecond, "a lost event id beyond one per silenced device", func() bool {
		return len(h.lost.MsgIDs()) > len(want)
	})
	return want
}

// doublingScanner is a scanner with the drain duties checked often.
func (h *harness) doublingScanner(replica string) (*Scanner, *prometheus.Registry) {
	return h.scanner(replica, func(o *Options) {
		o.Poll = 25 * time.Millisecond
		o.DrainCheck = 200 * time.Millisecond
	})
}

// Outcomes of the crossing rule, the label of crossing_total.
const (
	crossStale = "stale"
	crossFire  = "fire"
)

func (h *harness) crossings(ss ...*Scanner) map[string]float64 {
	out := map[string]float64{}
	for _, s := range ss {
		for o, v := range testenv.Series(h.t, h.regs[s], "sigwatch_scanner_crossing_total", "outcome") {
			out[o] += v
		}
	}
	return out
}

// runDoublings runs the scenario of the doubling tests on h: devices
// written by writers lagging by lags, two scanner replicas, two doublings
// from h.shards.
func runDoublings(t *testing.T, h *harness, devices int, lags []time.Duration) (views []*laggingView, ss []*Scanner, finished []time.Time) {
	h.advanceWatermark()
	stopTopo := h.watchTopology()

	a, _ := h.doublingScanner("a")
	b, _ := h.doublingScanner("b")
	stopA, stopB := h.run(a), h.run(b)
	l, views := startLoad(t, h, devices, lags)
	time.Sleep(time.Second)
	for range 2 {
		_, done := h.double(t, 20*time.Second)
		finished = append(finished, done)
		time.Sleep(500 * time.Millisecond)
	}

	want := waitAllLost(t, h, l)
	// Scanners stop before writers: the live devices must not fall due.
	stopA()
	stopB()
	l.stop()
	stopTopo()
	h.checkNoLeak()
	checkLost(t, h, want, l.written())
	if cur, _ := h.store.Topology(h.ctx); cur.Shards != 4*h.shards || cur.Prev != 0 || cur.Epoch != 5 {
		t.Errorf("final topology %+v, want %d shards, not draining, epoch 5", cur, 4*h.shards)
	}
	t.Logf("%d devices, %d silenced; crossing outcomes %v", devices, len(want), h.crossings(a, b))
	return views, []*Scanner{a, b}, finished
}

// TestDoublingUnderLoad proves invariants 1, 2 and 3 across two doublings,
// 16 -> 32 -> 64, while thousands of devices are reset and a random subset
// goes silent at random moments: exactly the silenced set is reported lost,
// none early, none twice.
func TestDoublingUnderLoad(t *testing.T) {
	h := newHarness(t, 16)
	_, ss, _ := runDoublings(t, h, 2000, []time.Duration{0, 0, 0})
	if c := h.crossings(ss...); c[crossFire] == 0 {
		t.Errorf("crossing outcomes %v, want moved devices fired through the crossing rule", c)
	}
}

// TestDoublingWithLaggingWriter proves the same with one writer adopting
// each new topology 3s late, so it keeps placing moved devices in their old
// shards while the others write the new ones: the crossing rule drops the
// stale copies, and the drain waits for the laggard before it raises the
// floors and finishes.
func TestDoublingWithLaggingWriter(t *testing.T) {
	h := newHarness(t, 16)
	const lag = 3 * time.Second
	views, ss, finished := runDoublings(t, h, 2000, []time.Duration{0, lag, 0})
	if c := h.crossings(ss...); c[crossStale] == 0 {
		t.Errorf("crossing outcomes %v, want stale copies dropped", c)
	}
	for k, n := range []int{32, 64} {
		at, ok := views[1].adoptedShards(n)
		if !ok {
			t.Errorf("the lagging writer never adopted %d shards (switches %v)", n, views[1].switches())
			continue
		}
		if !finished[k].After(at) {
			t.Errorf("doubling to %d drained at %v, before the lagging writer adopted it at %v: want the drain to wait for it",
				n, finished[k].Format("15:04:05.000"), at.Format("15:04:05.000"))
		}
	}
}

// TestDoublingOnRedisCluster proves the same on a 3-master Redis Cluster:
// every script runs on its shard's slot, and the shards spread over every
// master.
func TestDoublingOnRedisCluster(t *testing.T) {
	cluster := testenv.RedisCluster(t, 3)
	h := newHarnessOn(t, 16, cluster.Addrs)
	runDoublings(t, h, 1500, []time.Duration{0, 500 * time.Millisecond})
	for _, addr := range cluster.Addrs {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		var layouts int
		var cursor uint64
		for {
			e, err := c.Do(h.ctx, c.B().Scan().Cursor(cursor).Match("sw:{*}:layout").Count(1000).Build()).AsScanEntry()
			if err != nil {
				t.Fatal(err)
			}
			layouts += len(e.Elements)
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
		c.Close()
		if layouts == 0 {
			t.Errorf("master %s holds no shard, want the shards spread over every master", addr)
		}
		t.Logf("master %s holds the layouts of %d of the 32 old shards", addr, layouts)
	}
}

// TestDoublingWithReplicasDyingAndJoining proves ownership during a
// doubling: of three replicas, one dies (no release, no leave) and another
// joins while the doubling drains; within the lease time every shard,
// including the new ones, has exactly one owner among the live replicas,
// and invariants 1, 2 and 3 hold as before.
func TestDoublingWithReplicasDyingAndJoining(t *testing.T) {
	h := newHarness(t, 16)
	h.advanceWatermark()
	stopTopo := h.watchTopology()

	scanners := map[string]*Scanner{}
	stops := map[string]func(){}
	start := func(name string) {
		s, _ := h.doublingScanner(name)
		scanners[name], stops[name] = s, h.run(s)
	}
	for _, name := range []string{"a", "b", "c"} {
		start(name)
	}
	l, _ := startLoad(t, h, 1500, []time.Duration{0, 0})
	time.Sleep(time.Second)

	got, err := h.store.Double(h.ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	// b dies, d joins, while the doubling drains.
	died := time.Now()
	scanners["b"].killed.Store(true)
	stops["b"]()
	start("d")
	live := []string{"a", "c", "d"}
	// The lease runs out on the wall clock; the rebalances, the topology
	// poll and the acquisitions after it are work, which a loaded machine
	// (race detector, other test binaries) does several times slower: 4x
	// here. It takes about 1.1s unloaded; a takeover that waited for
	// anything but b's lease would take far longer.
	const lease, work = time.Second, 3*100*time.Millisecond + 500*time.Millisecond // rebalances + topology poll
	bound := lease + 4*work
	testenv.WaitFor(t, bound, "every shard to have exactly one live owner", func() bool {
		return oneOwnerEach(h, got.Shards, live, scanners)
	})
	t.Logf("every one of %d shards had one live owner %v after b died", got.Shards, time.Since(died).Round(time.Millisecond))
	testenv.WaitFor(t, 20*time.Second, "the doubling to drain", func() bool {
		cur, err := h.store.Topology(h.ctx)
		return err == nil && cur.Prev == 0
	})
	h.double(t, 20*time.Second)
	testenv.WaitFor(t, bound, "every shard of 64 to have exactly one live owner", func() bool {
		return oneOwnerEach(h, 64, live, scanners)
	})
	time.Sleep(300 * time.Millisecond)

	want := waitAllLost(t, h, l)
	for _, name := range live {
		stops[name]()
	}
	l.stop()
	stopTopo()
	h.checkNoLeak()
	checkLost(t, h, want, l.written())
	t.Logf("%d silenced; crossing outcomes %v", len(want), h.crossings(scanners["a"], scanners["c"], scanners["d"]))
}

// oneOwnerEach reports whether each of n shards is leased by exactly one of
// the live replicas, and no replica runs a loop for a shard it does not
// lease.
func oneOwnerEach(h *harness, n int, live []string, scanners map[string]*Scanner) bool {
	owners := map[int]string{}
	for _, name := range live {
		for _, i := range scanners[name].Owned() {
			if _, dup := owners[i]; dup {
				return false
			}
			owners[i] = name
		}
	}
	if len(owners) != n {
		return false
	}
	for i := range n {
		v, err := h.store.Owner(h.ctx, i)
		if err != nil || !strings.HasPrefix(v, owners[i]+"|") {
			return false
		}
	}
	return true
}

// movedDue puts a device that moves from shard 0 of 1 to shard 1 of 2, due
// 100ms ago, into shard 0, then doubles to two shards: its copy waits in its
// old shard. It returns the id and the deadline.
func (h *harness) movedDue(prefix string) (string, int64) {
	h.t.Helper()
	id := movedIDs(prefix, 1)[0]
	due := time.Now().Add(-100 * time.Millisecond).UnixMilli()
	h.add(shard.Entry{ID: id, Deadline: due})
	if _, err := h.store.Double(h.ctx, time.Now()); err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.topo.Refresh(h.ctx); err != nil {
		h.t.Fatal(err)
	}
	return id, due
}

// movedIDs returns n device ids that move from shard 0 of 1 to shard 1 of
// 2, with prefix.
func movedIDs(prefix string, n int) []string {
	var out []string
	for k := 0; len(out) < n; k++ {
		if id := fmt.Sprintf("%s-%d", prefix, k); shard.Of(id, 2) == 1 {
			out = append(out, id)
		}
	}
	return out
}

// TestCrossingRule proves each case of the crossing rule (invariants 1 and
// 3 for a moved device whose copies sit in its old and new shard): a later
// copy elsewhere makes the due one stale; of two equal copies only the new
// shard's fires; a lower copy elsewhere is left to its owner, which drops it;
// a copy whose partner is gone fires unless the device already fired at its
// deadline or later.
func TestCrossingRule(t *testing.T) {
	h := newHarness(t, 1)
	h.advanceWatermark()
	d := time.Now().Add(-100 * time.Millisecond).UnixMilli()
	later := time.Now().Add(time.Hour).UnixMilli()
	ids := movedIDs("x", 6)
	staleOld, equal, lower, firedElsewhere, alone, staleNew := ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]
	put := func(i int, id string, dl int64) {
		t.Helper()
		if _, err := h.store.Upsert(h.ctx, shard.Deadlines, map[int][]shard.Entry{i: {{ID: id, Deadline: dl}}}); err != nil {
			t.Fatal(err)
		}
	}
	put(0, staleOld, d)
	put(1, staleOld, later)
	put(0, equal, d)
	put(1, equal, d)
	put(0, lower, d-50)
	put(1, lower, d)
	put(0, firedElsewhere, d)
	if err := h.store.LostMarks().Mark(h.ctx, firedElsewhere, d+10, d+20); err != nil {
		t.Fatal(err)
	}
	put(0, alone, d)
	put(0, staleNew, later) // a lagging writer wrote the later signal into the old shard
	put(1, staleNew, d)
	if _, err := h.store.Double(h.ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.topo.Refresh(h.ctx); err != nil {
		t.Fatal(err)
	}
	s, _ := h.scanner("a", nil)
	stop := h.run(s)
	testenv.WaitFor(t, 5*time.Second, "three lost events", func() bool { return h.lost.Len() >= 3 })
	testenv.WaitFor(t, 5*time.Second, "the stale copies to be dropped", func() bool {
		_, a, _ := h.store.Score(h.ctx, shard.Deadlines, 0, staleOld)
		_, b, _ := h.store.Score(h.ctx, shard.Deadlines, 1, staleNew)
		_, c, _ := h.store.Score(h.ctx, shard.Deadlines, 0, firedElsewhere)
		return !a && !b && !c
	})
	testenv.Never(t, 200*time.Millisecond, "a fourth lost event", func() bool { return h.lost.Len() > 3 })
	stop()
	h.checkNoLeak()

	for id, want := range map[string][]int64{equal: {d}, lower: {d}, alone: {d}, staleOld: nil, staleNew: nil, firedElsewhere: nil} {
		var got []int64
		for _, ev := range h.lost.Bodies(of(id)) {
			got = append(got, ev.Deadline)
			if want != nil && ev.Shard != 1 && id == equal {
				t.Errorf("%s fired from shard %d, want from its new shard 1", id, ev.Shard)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: got lost events at %v, want %v", id, got, want)
		}
	}
	for _, c := range []struct {
		id    string
		shard int
		want  int64
	}{{staleOld, 1, later}, {staleNew, 0, later}} {
		if sc, ok, _ := h.store.Score(h.ctx, shard.Deadlines, c.shard, c.id); !ok || sc != c.want {
			t.Errorf("%s: later copy in shard %d got %d (present %v), want %d kept", c.id, c.shard, sc, ok, c.want)
		}
	}
	if distinct := h.streamLost(); sum(distinct) != 3 || len(distinct) != 3 {
		t.Errorf("stream holds %d lost messages with %d distinct ids, want 3 and 3", sum(distinct), len(distinct))
	}
}

// TestCrossingBeforeTopologyIsSeen proves invariant 1 for a scanner that
// has not yet seen a doubling that writers already use: the claim reads the
// shard's layout, so the due copy in the old shard is checked against the
// later copy a writer put in the new shard, and is not fired.
func TestCrossingBeforeTopologyIsSeen(t *testing.T) {
	h := newHarness(t, 1)
	h.advanceWatermark()
	d := time.Now().Add(-100 * time.Millisecond).UnixMilli()
	id := movedIDs("y", 1)[0]
	if _, err := h.store.Upsert(h.ctx, shard.Deadlines, map[int][]shard.Entry{0: {{ID: id, Deadline: d}}}); err != nil {
		t.Fatal(err)
	}
	// The scanner's watcher is not running: it keeps seeing one shard.
	if _, err := h.store.Double(h.ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour).UnixMilli()
	w := shard.NewWriter(h.store, "w", func() shard.Topology { t, _ := h.store.Topology(h.ctx); return t }, h.store.Topology)
	if _, err := w.Upsert(h.ctx, shard.Deadlines, []shard.Entry{{ID: id, Deadline: later}}, nil); err != nil {
		t.Fatal(err)
	}
	s, _ := h.scanner("a", nil)
	stop := h.run(s)
	testenv.WaitFor(t, 3*time.Second, "the stale copy to be dropped", func() bool {
		_, ok, _ := h.store.Score(h.ctx, shard.Deadlines, 0, id)
		return !ok
	})
	stop()
	h.checkNoLeak()
	if got := h.topo.Current(); got.Shards != 1 {
		t.Fatalf("scanner view %+v, want it still at one shard for this test", got)
	}
	if got := h.lost.Bodies(of(id)); len(got) != 0 {
		t.Errorf("%s fired at %d although its deadline is %d: an early fire", id, got[0].Deadline, later)
	}
}

// TestOwnerDeadBetweenMarkAndPublishDuringDoubling proves invariant 2
// across the crossing rule: the owner of the shard a moved device fires
// from marks it lost and dies before it publishes. Its own mark must not
// read as a fire from the partner shard: the next owner claims the copy
// again and publishes the one lost event. The copy that fires is the old
// shard's when it is alone, the new shard's when both hold the deadline.
func TestOwnerDeadBetweenMarkAndPublishDuringDoubling(t *testing.T) {
	for _, both := range []bool{false, true} {
		name := map[bool]string{false: "old copy alone", true: "equal copies"}[both]
		t.Run(name, func(t *testing.T) { ownerDeadBetweenMarkAndPublish(t, both) })
	}
}

func ownerDeadBetweenMarkAndPublish(t *testing.T, both bool) {
	h := newHarness(t, 1)
	h.advanceWatermark()
	id, due := h.movedDue("m")
	if both {
		if _, err := h.store.Upsert(h.ctx, shard.Deadlines, map[int][]shard.Entry{1: {{ID: id, Deadline: due}}}); err != nil {
			t.Fatal(err)
		}
	}

	// a marks the device, then loses Redis for good before it publishes.
	a, proxy := h.scannerBehindProxy("a")
	held, release := holdFirstPublish(a)
	stopA := h.run(a)
	letGo := sync.OnceFunc(func() {
		proxy.Release()
		close(release)
	})
	t.Cleanup(letGo) // before stopA, should the test fail meanwhile
	<-held
	proxy.Hold()
	if marks, _ := h.store.LostMarks().Of(h.ctx, []string{id}); marks[0] != due {
		t.Fatalf("lost mark %d before the publish, want %d", marks[0], due)
	}

	b, _ := h.scanner("b", nil)
	stopB := h.run(b)
	h.lost.Wait(t, 10*time.Second, "the lost event from the next owner", of(id))
	testenv.WaitFor(t, 5*time.Second, "the fired copy settled", func() bool {
		_, old, _ := h.store.Score(h.ctx, shard.Deadlines, 0, id)
		_, nw, _ := h.store.Score(h.ctx, shard.Deadlines, 1, id)
		return !old && !nw
	})
	letGo()
	stopA()
	stopB()
	if got := h.streamLost(); got[dispatch.LostID(id, due)] != 1 || sum(got) != 1 {
		t.Errorf("stream holds %v, want one lost event for %s at %d", got, id, due)
	}
}
