package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sigwatch/sigwatch/internal/periodic"
)

// Topology is the shard layout: N shards, the N before the last doubling
// while it drains (0 otherwise), an epoch that grows with each change, and
// when the last change happened (unix ms, 0 before the first doubling).
type Topology struct {
	Shards int   `json:"shards"`
	Prev   int   `json:"prev"`
	Epoch  int64 `json:"epoch"`
	Since  int64 `json:"since,omitempty"`
}

// Draining reports whether a doubling is still draining.
func (t Topology) Draining() bool { return t.Prev != 0 }

// Locate returns the shards that may hold id: its shard and, while a
// doubling drains, its shard before it.
func (t Topology) Locate(id string) []int {
	cur := Of(id, t.Shards)
	if t.Prev != 0 {
		if old := Of(id, t.Prev); old != cur {
			return []int{cur, old}
		}
	}
	return []int{cur}
}

// InitTopology creates the topology with initial shards if none exists and
// returns the topology in force.
func (s *Store) InitTopology(ctx context.Context, initial int) (Topology, error) {
	if err := ValidCount(initial); err != nil {
		return Topology{}, fmt.Errorf("shard: init topology: %w", err)
	}
	b := s.c.B()
	key := s.k.Topology()
	for _, r := range s.c.DoMulti(ctx,
		b.Hsetnx().Key(key).Field("shards").Value(strconv.Itoa(initial)).Build(),
		b.Hsetnx().Key(key).Field("prev").Value("0").Build(),
		b.Hsetnx().Key(key).Field("epoch").Value("1").Build(),
	) {
		if err := r.Error(); err != nil {
			return Topology{}, fmt.Errorf("shard: init topology: %w", err)
		}
	}
	return s.Topology(ctx)
}

// ErrNoTopology is returned by Topology when Redis holds none: a new
// installation, or a Redis that lost its data.
var ErrNoTopology = errors.New("shard: no topology in Redis yet: start `sigwatch run` once to create it")

// Topology reads the topology in force, or ErrNoTopology.
func (s *Store) Topology(ctx context.Context) (Topology, error) {
	m, err := s.hashAll(ctx, s.k.Topology(), "topology")
	if err != nil {
		return Topology{}, err
	}
	if len(m) == 0 {
		return Topology{}, ErrNoTopology
	}
	var t Topology
	t.Shards, _ = strconv.Atoi(m["shards"])
	t.Prev, _ = strconv.Atoi(m["prev"])
	t.Epoch, _ = strconv.ParseInt(m["epoch"], 10, 64)
	t.Since, _ = strconv.ParseInt(m["since"], 10, 64)
	if err := ValidCount(t.Shards); err != nil {
		return Topology{}, fmt.Errorf("shard: topology in Redis is corrupt: %w", err)
	}
	return t, nil
}

// Watcher keeps the topology in force current by polling Redis, so every
// role notices a doubling within one interval.
type Watcher struct {
	store    *Store
	interval time.Duration
	log      *slog.Logger
	cur      atomic.Pointer[Topology]
	// reading serialises Refresh: of two reads that overlap, the older
	// must not be compared with what the newer stored, as if Redis had
	// gone back.
	reading sync.Mutex
	// lower, if set, is told of a topology read below the one in force:
	// Redis lost or rolled it back.
	lower atomic.Pointer[func(seen, read Topology)]
}

// OnLower sets f to be told when Redis holds a lower topology than one the
// watcher has seen. The watcher never adopts it (a topology is never
// lowered); f is how a loss detector hears of it.
func (w *Watcher) OnLower(f func(seen, read Topology)) { w.lower.Store(&f) }

// Set makes t the topology in force if its epoch is higher than the one
// the watcher holds (a restore wrote it).
func (w *Watcher) Set(t Topology) {
	if t.Epoch > w.Current().Epoch {
		w.cur.Store(&t)
	}
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
	w.reading.Lock()
	defer w.reading.Unlock()
	t, err := w.store.Topology(ctx)
	if err != nil {
		return w.Current(), err
	}
	old := w.Current()
	if t.Epoch < old.Epoch {
		if f := w.lower.Load(); f != nil {
			(*f)(old, t)
		}
		return old, fmt.Errorf("shard: Redis holds topology epoch %d below epoch %d already seen: kept %d shards", t.Epoch, old.Epoch, old.Shards)
	}
	if old.Epoch != t.Epoch && w.log != nil {
		w.log.Info("topology changed", "shards", t.Shards, "prev", t.Prev, "epoch", t.Epoch)
	}
	w.cur.Store(&t)
	return t, nil
}

// Run polls until ctx is done.
func (w *Watcher) Run(ctx context.Context) {
	periodic.Run(ctx, w.interval, func(time.Time) {
		if _, err := w.Refresh(ctx); err != nil && ctx.Err() == nil && w.log != nil {
			w.log.Warn("topology refresh failed", "err", err)
		}
	})
}
