package shard

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Watcher keeps the topology in force current by polling Redis, so every
// role notices a doubling within one interval.
type Watcher struct {
	store    *Store
	interval time.Duration
	log      *slog.Logger
	cur      atomic.Pointer[Topology]
}

// NewWatcher reads the topology once (creating it with initial shards if
// Redis has none) and returns a watcher that keeps it current.
func NewWatcher(ctx context.Context, store *Store, initial int, interval time.Duration, log *slog.Logger) (*Watcher, error) {
	t, err := store.InitTopology(ctx, initial)
	if err != nil {
		return nil, err
	}
	if interval <= 0 {
		interval = 500 * time.Millisecond
	}
	w := &Watcher{store: store, interval: interval, log: log}
	w.cur.Store(&t)
	return w, nil
}

// Current returns the topology last read.
func (w *Watcher) Current() Topology { return *w.cur.Load() }

// Refresh reads the topology now.
func (w *Watcher) Refresh(ctx context.Context) (Topology, error) {
	t, err := w.store.Topology(ctx)
	if err != nil {
		return w.Current(), err
	}
	if old := w.Current(); old.Epoch != t.Epoch && w.log != nil {
		w.log.Info("topology changed", "shards", t.Shards, "prev", t.Prev, "epoch", t.Epoch)
	}
	w.cur.Store(&t)
	return t, nil
}

// Run polls until ctx is done.
func (w *Watcher) Run(ctx context.Context) {
	tick := time.NewTicker(w.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if _, err := w.Refresh(ctx); err != nil && ctx.Err() == nil && w.log != nil {
				w.log.Warn("topology refresh failed", "err", err)
			}
		}
	}
}

// Thresholds decides how long a device may stay silent: a per-device
// override if one is set, else the threshold of its type, else the default.
// Overrides are cached and reloaded when their version in Redis changes.
type Thresholds struct {
	Default time.Duration
	ByType  map[string]time.Duration

	store     *Store
	mu        sync.RWMutex
	overrides map[string]time.Duration
	version   int64
}

// NewThresholds returns thresholds backed by store's overrides.
func NewThresholds(store *Store, def time.Duration, byType map[string]time.Duration) *Thresholds {
	return &Thresholds{Default: def, ByType: byType, store: store, version: -1}
}

// For returns the threshold of device id of type typ.
func (t *Thresholds) For(id, typ string) time.Duration {
	t.mu.RLock()
	d, ok := t.overrides[id]
	t.mu.RUnlock()
	if ok {
		return d
	}
	if d, ok := t.ByType[typ]; ok {
		return d
	}
	return t.Default
}

// Reload reads the overrides if their version changed.
func (t *Thresholds) Reload(ctx context.Context) error {
	v, err := t.store.OverridesVersion(ctx)
	if err != nil {
		return err
	}
	t.mu.RLock()
	same := v == t.version
	t.mu.RUnlock()
	if same {
		return nil
	}
	m, err := t.store.Overrides(ctx)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.overrides, t.version = m, v
	t.mu.Unlock()
	return nil
}

// Run reloads every interval until ctx is done.
func (t *Thresholds) Run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if err := t.Reload(ctx); err != nil && ctx.Err() == nil && log != nil {
				log.Warn("threshold overrides reload failed", "err", err)
			}
		}
	}
}
