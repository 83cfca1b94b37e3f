package queue

import (
	"context"
	"sync"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// watermark shares one read of the ingest watermark among the shard loops.
// A step takes the last value read, reading it itself only when no read is
// younger than maxAge (so busy loops read it about once per maxAge, for all
// the engine's shards, and sleeping ones not at all). A loop whose head is
// due by the clock but not by the watermark waits for a later one instead
// (wait): while any does, the refresher (run, owned by Engine.Run) reads
// the watermark as soon as a rise is announced (shard.Store.WatermarkMoves,
// see notify), and every watermarkEvery in case an announcement was lost,
// and wakes the waiting loops as soon as it moved, rather than a poll
// later. An older watermark is never unsafe: it only holds firing back
// (invariant 6).
type watermark struct {
	store   *shard.Store
	maxAge  time.Duration
	refresh time.Duration
	hold    time.Duration // the longest wait for a later watermark (bound)
	kick    chan struct{} // wakes an idle refresher
	moved   chan struct{} // a rise was announced: read now

	mu        sync.Mutex
	read      time.Time // when wm was read; real time, for freshness only
	wm        int64
	outages   []shard.Outage
	wantUntil time.Time // the refresher runs until then
	// outN and outLast are the length and last entry of the outage list
	// when outages was read.
	outN    int64
	outLast shard.Outage
	changed chan struct{} // closed, and replaced, when wm moves forward
}

// newWatermark returns a watermark read at least every maxAge while steps
// ask for it and, while loops wait for it to move (for at most hold each),
// every refresh.
func newWatermark(store *shard.Store, maxAge, refresh, hold time.Duration) *watermark {
	return &watermark{store: store, maxAge: maxAge, refresh: refresh, hold: hold, kick: make(chan struct{}, 1),
		moved: make(chan struct{}, 1), outN: -1, changed: make(chan struct{})}
}

// bound is how long a loop waits on wait's channel before it looks again
// by itself.
func (w *watermark) bound() time.Duration { return w.hold }

// get returns the watermark and the recorded outages.
func (w *watermark) get(ctx context.Context) (int64, []shard.Outage, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.read.IsZero() || time.Since(w.read) >= w.maxAge {
		if err := w.refreshLocked(ctx); err != nil {
			return 0, nil, err
		}
	}
	return w.wm, w.outages, nil
}

// wait returns a channel closed once a watermark later than wm is read, and
// keeps the refresher reading for the bound.
func (w *watermark) wait(wm int64) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wantUntil = time.Now().Add(w.hold)
	select {
	case w.kick <- struct{}{}:
	default:
	}
	if w.wm > wm {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return w.changed
}

// notify says a rise of the watermark was announced: a waiting refresher
// reads it at once. It does not block.
func (w *watermark) notify() {
	select {
	case w.moved <- struct{}{}:
	default:
	}
}

// wanted reports whether a loop waits for a later watermark.
func (w *watermark) wanted() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return time.Now().Before(w.wantUntil)
}

// refreshLocked reads the watermark; the caller holds mu. The outages are
// read again only when the list changed: it only grows at its end (and is
// trimmed at its start), so its length and last entry say whether it did.
// Either read takes the watermark before the outages, in one round trip, and
// an outage is recorded before the watermark that jumped over it: a
// watermark is never paired with outages older than it.
func (w *watermark) refreshLocked(ctx context.Context) error {
	wm, n, tail, err := w.store.Watermarks().Tail(ctx, 1)
	if err != nil {
		return err
	}
	var last shard.Outage
	if len(tail) > 0 {
		last = tail[0]
	}
	if n != w.outN || last != w.outLast {
		var outs []shard.Outage
		if wm, outs, err = w.store.Watermarks().Read(ctx); err != nil {
			return err
		}
		w.outages, w.outN, w.outLast = outs, n, last
	}
	w.read = time.Now()
	if wm > w.wm {
		w.wm = wm
		close(w.changed)
		w.changed = make(chan struct{})
	}
	return nil
}

// run reads the watermark every refresh while a loop waits for it to move,
// and sleeps otherwise, until ctx is done. While a loop waits it also asks
// ingest, every askEvery, to probe at its full rate (an idle ingest probes
// slower). Before ingest first ran there is nothing to fire promptly, and it
// reads only every noneRefresh. Failures are left to the loops: get reads by
// itself once no read is fresh.
func (w *watermark) run(ctx context.Context) {
	t := time.NewTimer(w.refresh)
	defer t.Stop()
	var asked time.Time
	for {
		w.mu.Lock()
		wanted := time.Now().Before(w.wantUntil)
		w.mu.Unlock()
		if !wanted {
			select {
			case <-ctx.Done():
				return
			case <-w.kick:
			}
		}
		if time.Since(asked) >= askEvery {
			asked = time.Now()
			_ = w.store.Watermarks().Want(ctx)
		}
		w.mu.Lock()
		_ = w.refreshLocked(ctx)
		next := w.refresh
		if w.wm == 0 {
			next = max(next, noneRefresh)
		}
		w.mu.Unlock()
		t.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.moved:
		}
	}
}

// noneRefresh is the refresher's period while no watermark exists yet;
// askEvery how often a waiting engine asks ingest for its full probe rate.
const (
	noneRefresh = 250 * time.Millisecond
	askEvery    = 100 * time.Millisecond
)
