package ingest

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sigwatch/sigwatch/internal/ratelog"
	"github.com/sigwatch/sigwatch/shard"
)

// watermark is the stage that keeps this member's watermark (docs/guarantees.md,
// guarantee 6). The pipeline tells it when a probe barrier is cut and when
// a flush completes; once every flush cut before a barrier has completed,
// the probe's send time is a time up to which this member has consumed,
// and the stage stores it as the member's report. The store moves the
// global watermark to what the members together have consumed.
//
// Its input ends when the pipeline, its only sender, calls close; run then
// stores the last barrier that passed and returns.
type watermark struct {
	store  *shard.Store
	breaks *breaks // the connection's breaks, reported with the watermark
	member shard.Member
	opts   *Options
	log    *slog.Logger
	m      *metrics
	errLog *ratelog.Limiter

	track tracker
	ready atomic.Int64  // highest probe time whose barrier passed
	kick  chan struct{} // wakes run when ready moved
	done  chan struct{} // closed by close: nothing passes any more

	stored    atomic.Int64 // this member's watermark last stored, unix ms
	startedAt atomic.Int64 // unix ms when Run started
}

func newWatermark(opts *Options, store *shard.Store, br *breaks, m *metrics, log *slog.Logger) *watermark {
	return &watermark{
		store:  store,
		breaks: br,
		member: shard.Member{Group: opts.SharedGroup, ID: opts.ClientID},
		opts:   opts,
		log:    log,
		m:      m,
		errLog: ratelog.New(time.Second, opts.Now),
		track:  tracker{ahead: make(map[uint64]struct{})},
		kick:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
}

// barrier registers the barrier of the probe sent at probe, cut after
// flush after.
func (w *watermark) barrier(after uint64, probe int64) {
	if ms, ok := w.track.barrier(after, probe); ok {
		w.advance(ms)
	}
}

// completed records that flush seq completed.
func (w *watermark) completed(seq uint64) {
	if ms, ok := w.track.complete(seq); ok {
		w.advance(ms)
	}
}

// advance records that the watermark may move to ms and wakes run.
func (w *watermark) advance(ms int64) {
	for {
		cur := w.ready.Load()
		if ms <= cur || w.ready.CompareAndSwap(cur, ms) {
			break
		}
	}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// close ends the stage's input. Only the pipeline calls it, once it has
// stopped.
func (w *watermark) close() { close(w.done) }

// run stores this member's watermark whenever a barrier passes, retrying a
// failed store every probe interval, until close; then it stores the last
// one that passed. ctx bounds the Redis calls.
func (w *watermark) run(ctx context.Context) {
	var stored int64
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	store := func() {
		ms := w.ready.Load()
		if ms <= stored {
			return
		}
		sctx, cancel := context.WithTimeout(ctx, storeTimeout)
		outs := shard.Outages{Gap: w.opts.OutageAfter, Keep: w.opts.Thresholds.Max() + outageMargin}
		var gen uint64
		outs.Through, outs.GraceFrom, gen = w.breaks.report(ms)
		_, dropped, err := w.store.Watermarks().AdvanceMember(sctx, w.member, ms, w.opts.Now(), w.opts.MemberTimeout, outs)
		cancel()
		if dropped > 0 {
			w.log.Error("the outage list reached its cap; the oldest outages were dropped and devices silent across them may be declared lost",
				"dropped", dropped, "cap", shard.OutagesCap)
		}
		if err != nil {
			w.m.storeErrors.Inc()
			w.errLog.Warn(w.log, "advance", "advance watermark failed", "err", err)
			retry.Reset(w.opts.ProbeInterval)
			return
		}
		if outs.Through != 0 {
			w.breaks.reported(gen)
			attrs := []any{"through", time.UnixMilli(outs.Through)}
			if outs.GraceFrom != 0 {
				attrs = append(attrs, "reconnect_grace_from", time.UnixMilli(outs.GraceFrom))
			}
			w.log.Info("the lost broker connection is recorded as an ingest outage", attrs...)
		}
		stored = ms
		w.stored.Store(ms)
	}
	for {
		select {
		case <-w.done:
			store()
			return
		case <-w.kick:
			store()
		case <-retry.C:
			store()
		}
	}
}

// join records this member in its shared group's watermark at ms, unless
// it is already there (see shard.Watermarks.Join).
func (w *watermark) join(ctx context.Context, ms int64) error {
	return w.store.Watermarks().Join(ctx, w.member, ms)
}

// passed waits until the barrier of the probe sent at ms has passed: every
// signal received before that probe is stored and acked. It reports false
// if that did not happen within wait.
func (w *watermark) passed(ms int64, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for w.ready.Load() < ms {
		if time.Now().After(deadline) {
			return false
		}
		// A one-off wait while stopping: polling keeps run the only reader
		// of kick.
		time.Sleep(time.Millisecond)
	}
	return true
}

// leave takes this member out of its group's watermark, so that the group
// need not wait for it: for a member stopping on purpose with everything
// stored.
func (w *watermark) leave(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	if err := w.store.Watermarks().Leave(lctx, w.member); err != nil {
		w.log.Warn("leaving the ingest members failed; the group waits for the member timeout", "err", err)
	}
}

// outageMargin is how long, beyond the longest threshold, an outage is
// kept: how far behind the watermark a scanner may fall (stopped, or
// catching up) and still find the outages its deadlines' silence overlapped.
const outageMargin = 24 * time.Hour

// age is how long ago, at now, the watermark this member last stored was
// (since Run started, before the first), in seconds.
func (w *watermark) age(now time.Time) float64 {
	wm := max(w.stored.Load(), w.startedAt.Load())
	if wm == 0 {
		return 0
	}
	return float64(now.UnixMilli()-wm) / 1000
}

// tracker knows which flushes have completed, and which probe barriers are
// therefore passed: a barrier cut after flush n is passed once every flush
// numbered n or lower has completed. Flushes complete out of order.
type tracker struct {
	mu       sync.Mutex
	done     uint64              // every flush numbered done or lower has completed
	ahead    map[uint64]struct{} // completed flushes above done
	barriers []barrier           // not yet passed, in order
}

type barrier struct {
	after uint64
	probe int64
}

// barrier registers the barrier of the probe sent at probe, cut after flush
// after. ok reports that it is already passed.
func (t *tracker) barrier(after uint64, probe int64) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if after <= t.done && len(t.barriers) == 0 {
		return probe, true
	}
	t.barriers = append(t.barriers, barrier{after, probe})
	return t.passed()
}

// complete records that flush seq completed and returns the latest probe
// time whose barrier is now passed, if any.
func (t *tracker) complete(seq uint64) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ahead[seq] = struct{}{}
	for {
		if _, ok := t.ahead[t.done+1]; !ok {
			break
		}
		delete(t.ahead, t.done+1)
		t.done++
	}
	return t.passed()
}

func (t *tracker) passed() (ms int64, ok bool) {
	n := 0
	for n < len(t.barriers) && t.barriers[n].after <= t.done {
		ms = max(ms, t.barriers[n].probe)
		n++
	}
	if n == 0 {
		return 0, false
	}
	t.barriers = append(t.barriers[:0], t.barriers[n:]...)
	return ms, true
}
