package guard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// Options wire a Guard.
type Options struct {
	Store *shard.Store // the deadlines' store
	Topo  *shard.Watcher
	// Alarm and AlarmTopo are the alarm's repeat timer queue (nil without).
	Alarm     *shard.Store
	AlarmTopo *shard.Watcher
	// Registry is the durable device registry (nil: NATS in core mode; a
	// loss is then detected and reported, but devices only Redis knew of
	// are not watched again).
	Registry   *dispatch.Registry
	Pub        *dispatch.Bus
	Thresholds *shard.Thresholds
	// Timers is the generic timers' journal (nil: none), TimerDurable says
	// which queues it keeps (nil: all).
	Timers       *dispatch.TimerJournal
	TimerDurable func(queue string) bool
	// RestoreAlarm puts back an alarm state the registry kept (nil: none).
	RestoreAlarm func(ctx context.Context, id, raw string) error
	// RestoreStorms puts back the storms the registry kept and the scopes'
	// lost sets, from the lost devices restored (nil: none). It runs before
	// the alarms, so that a held alarm finds its storm.
	RestoreStorms func(ctx context.Context, lost []dispatch.DeviceRecord) error
	// RestoreLockTTL bounds how long a crashed restorer blocks the next
	// one (default 15s); a live restorer extends it as it goes.
	RestoreLockTTL time.Duration
	// Initial is the shard count of a new installation.
	Initial int
	// Interval is how often the generation is checked (default 200ms).
	Interval time.Duration
	// Checkpoint is how often one process copies the lost marks into the
	// registry (default 5m). A restore lays the event stream's losses
	// since over that copy, so the stream must keep events longer.
	Checkpoint time.Duration
	Now        func() time.Time
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// Guard watches for Redis losing data and restores it.
type Guard struct {
	o Options
	m *metrics

	mu       sync.Mutex
	lastSeq  int64 // the generation sequence last seen
	lastOK   int64 // when the generation was last found whole, unix ms
	reported chan suspicion
	runs     runs // the Redis processes seen serving (Run's goroutine only)

	// reason is why the process is not ready ("" when it is).
	reason atomic.Pointer[string]
	// seen are the highest topologies recorded in the registry's meta.
	seenEpoch, seenAlarmEpoch int64
}

// New returns a guard; Establish must run before the roles start.
func New(o Options) *Guard {
	if o.Interval <= 0 {
		o.Interval = 200 * time.Millisecond
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Checkpoint <= 0 {
		o.Checkpoint = DefaultCheckpoint
	}
	if o.RestoreLockTTL <= 0 {
		o.RestoreLockTTL = restoreLockTTL
	}
	g := &Guard{o: o, m: newMetrics(o.Registerer), reported: make(chan suspicion, 1)}
	none := ""
	g.reason.Store(&none)
	// A refusal means a shard's Redis process changed: a restart, which
	// the restore's check judges.
	o.Store.OnDataLoss(func(err error) { g.report("a shard refused work: "+err.Error(), false) })
	return g
}

// Watch has the topology watchers report a topology read below one they
// have seen (call it once they exist).
func (g *Guard) Watch(topo, alarmTopo *shard.Watcher) {
	g.o.Topo, g.o.AlarmTopo = topo, alarmTopo
	lower := func(seen, read shard.Topology) {
		g.report(fmt.Sprintf("Redis holds topology epoch %d, below epoch %d already seen", read.Epoch, seen.Epoch), true)
	}
	topo.OnLower(lower)
	if alarmTopo != nil {
		alarmTopo.OnLower(lower)
	}
}

// Ready reports whether the process works on whole data, and why not.
func (g *Guard) Ready() (bool, string) {
	r := *g.reason.Load()
	return r == "", r
}

func (g *Guard) setReason(r string) { g.reason.Store(&r) }

// suspicion is what was seen of a loss: certain, or in doubt until the
// restore has compared Redis with the registry.
type suspicion struct {
	why     string
	certain bool
}

// report tells the guard that something looks like a loss.
func (g *Guard) report(why string, certain bool) {
	select {
	case g.reported <- suspicion{why, certain}:
	default:
	}
}

// Establish finds the generation in force before the roles start: it
// creates one for a new installation, adopts the one in force, or, when
// Redis lost what the registry says existed, restores first.
func (g *Guard) Establish(ctx context.Context) error {
	now := g.o.Now().UnixMilli()
	rec, ok, err := g.o.Store.Beat(ctx, now)
	if err != nil {
		return err
	}
	meta, installed, err := g.meta(ctx)
	if err != nil {
		return err
	}
	switch {
	case ok && (meta.Generation == "" || meta.Generation == rec.ID):
		g.adopt(rec)
		return g.recordMeta(ctx, rec.ID)
	case ok:
		// Redis holds data of a generation the registry moved past: an old
		// replica or backup came back.
		g.adopt(rec)
		return g.incident(ctx, fmt.Sprintf("Redis holds generation %s, the registry says %s", rec.ID, meta.Generation), 0, true)
	case installed:
		return g.incident(ctx, "Redis holds no generation record but the registry knows this installation", 0, true)
	}
	return g.install(ctx, now)
}

// install creates the generation of a new installation (or of one from
// before generations: its topology stays as it is).
func (g *Guard) install(ctx context.Context, now int64) error {
	_, err := g.o.Store.Topology(ctx)
	upgrade := err == nil
	if err != nil && !errors.Is(err, shard.ErrNoTopology) {
		return err
	}
	t, err := g.o.Store.InitTopology(ctx, g.o.Initial)
	if err != nil {
		return err
	}
	if upgrade {
		if err := g.backfill(ctx, t); err != nil {
			return err
		}
	}
	id, err := g.o.Store.CreateGeneration(ctx, newID(), now)
	if err != nil {
		return err
	}
	if err := g.o.Store.Vet(ctx, t.Shards, id); err != nil {
		return err
	}
	if g.o.Alarm != nil {
		at, err := g.o.Alarm.InitTopology(ctx, t.Shards)
		if err != nil {
			return err
		}
		if err := g.o.Alarm.Vet(ctx, at.Shards, id); err != nil {
			return err
		}
	}
	g.o.Store.SetGeneration(id)
	g.lastOK = now
	return g.recordMeta(ctx, id)
}

func (g *Guard) adopt(rec shard.GenRecord) {
	g.o.Store.SetGeneration(rec.ID)
	g.mu.Lock()
	g.lastSeq, g.lastOK = rec.Seq, g.o.Now().UnixMilli()
	g.mu.Unlock()
}

// Run checks the generation every interval and handles a loss until ctx
// is done.
func (g *Guard) Run(ctx context.Context) error {
	t := time.NewTicker(g.o.Interval)
	defer t.Stop()
	cp := time.NewTicker(g.o.Checkpoint)
	defer cp.Stop()
	for {
		var why string
		certain := false
		select {
		case <-ctx.Done():
			return nil
		case s := <-g.reported:
			why, certain = s.why, s.certain
		case <-t.C:
		case <-cp.C:
			if err := g.checkpoint(ctx); err != nil && ctx.Err() == nil {
				g.o.Log.Warn("lost marks not copied into the registry; the event stream still has them", "err", err)
			}
			continue
		}
		if w := g.check(ctx); w != "" {
			why, certain = w, true
		} else if why != "" && !g.stillLost(ctx) {
			why = "" // a restore by another process explained it
		} else if why != "" && !certain {
			if ok, not := g.restartedWhole(ctx); ok {
				why = ""
			} else if not == errAsk {
				s := suspicion{why, certain} // judged at the next check
				time.AfterFunc(g.o.Interval, func() { g.report(s.why, s.certain) })
				continue
			} else {
				why += "; not proven whole: " + not
			}
		}
		if why == "" {
			g.trackTopology(ctx)
			g.pollRuns(ctx)
			continue
		}
		if err := g.incident(ctx, why, g.lossStart(), certain); err != nil && ctx.Err() == nil {
			g.o.Log.Error("restore after Redis data loss failed", "err", err)
		}
	}
}

// check beats the generation record and says what looks lost ("" if
// nothing, or Redis does not answer: an unreachable Redis is an outage the
// watermark handles, not a loss).
func (g *Guard) check(ctx context.Context) string {
	rec, ok, err := g.o.Store.Beat(ctx, g.o.Now().UnixMilli())
	if err != nil {
		return ""
	}
	known := g.o.Store.Generation()
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case !ok:
		return "the generation record is missing: Redis restarted empty, was flushed, or failed over to a replica without it"
	case rec.ID != known:
		// Another process restored: work under its generation.
		g.o.Store.SetGeneration(rec.ID)
	case rec.Seq <= g.lastSeq:
		return fmt.Sprintf("the generation sequence went back from %d to %d: Redis rolled back", g.lastSeq, rec.Seq)
	}
	g.lastSeq, g.lastOK = rec.Seq, g.o.Now().UnixMilli()
	return ""
}

// stillLost reports whether a reported refusal still stands: a claim made
// under a generation another process has since replaced is refused
// without any loss being left to handle.
func (g *Guard) stillLost(ctx context.Context) bool {
	if g.o.Store.Vetted(ctx, g.o.Topo.Current().Shards) != nil {
		return true
	}
	return g.o.Alarm != nil && g.o.AlarmTopo != nil && g.o.Alarm.Vetted(ctx, g.o.AlarmTopo.Current().Shards) != nil
}

// lossStart is when the data was last known whole.
func (g *Guard) lossStart() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastOK
}

// incident handles one loss, certain (the generation record is missing or
// behind) or in doubt (Redis restarted under a shard: the restore's check
// against the registry judges): not ready until the data is restored, by
// this process if it gets the restore lock, else by the one that has it.
func (g *Guard) incident(ctx context.Context, why string, since int64, certain bool) error {
	g.m.restoring.Set(1)
	defer g.m.restoring.Set(0)
	if certain {
		g.m.losses.Inc()
		g.setReason("redis data loss: " + why + "; restoring")
		g.o.Log.Error("Redis lost data; holding work until it is restored from the registry", "reason", why)
	} else {
		g.setReason("redis restarted: " + why + "; checking it against the registry")
		g.o.Log.Info("Redis restarted; holding work while its data is checked against the registry", "reason", why)
	}
	old := g.o.Store.Generation()
	token := newID()
	for {
		rec, ok, err := g.o.Store.Beat(ctx, g.o.Now().UnixMilli())
		if err == nil && ok && rec.ID != old {
			g.adopt(rec)
			break
		}
		if err == nil {
			got, lerr := g.o.Store.TakeLock(ctx, shard.RestoreLock, token, g.o.RestoreLockTTL)
			if lerr == nil && got {
				// A restorer writes the new generation before it lets the
				// lock go: one that finished since the beat above is seen
				// here, and not done again.
				if rec, ok, err = g.o.Store.Beat(ctx, g.o.Now().UnixMilli()); err == nil && ok && rec.ID != old {
					g.release(ctx, token)
					g.adopt(rec)
					break
				}
				if err == nil {
					err = g.restore(ctx, why, since, token, certain)
				}
				g.release(ctx, token)
				if err == nil {
					break
				}
				g.o.Log.Error("restore failed; retrying", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	g.setReason("")
	g.o.Log.Info("Redis data restored; working again", "generation", g.o.Store.Generation())
	return nil
}

// release lets the restore lock held with token go: a ttl of a
// millisecond ends it.
func (g *Guard) release(ctx context.Context, token string) {
	_, _ = g.o.Store.ExtendLock(context.WithoutCancel(ctx), shard.RestoreLock, token, time.Millisecond)
}

// restoreLockTTL is the default of Options.RestoreLockTTL.
const restoreLockTTL = 15 * time.Second

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

var errNoRegistry = errors.New("no durable registry (NATS core mode): devices only Redis knew of are not watched again")
