package shard

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Writer places timers by the topology it knows and writes them, for one
// ingest member. It tells the drain of a doubling which epoch it writes
// with (Run), and places again what a shard refused because the writer
// lagged behind a finished drain. It is safe for concurrent use.
type Writer struct {
	store   *Store
	name    string
	current func() Topology
	refresh func(context.Context) (Topology, error)

	mu       sync.Mutex
	inflight map[int64]int // epoch -> writes under way placed under it

	// moveRead, in tests, runs in MoveTimers between reading the old
	// copies and carrying them.
	moveRead func()
}

// NewWriter returns a writer named name (unique among the live writers,
// e.g. the ingest client id). current is the topology in force as the
// writer knows it (Watcher.Current); refresh reads it again from Redis
// (Watcher.Refresh). Tests make a writer lag by handing it a stale current.
func NewWriter(store *Store, name string, current func() Topology, refresh func(context.Context) (Topology, error)) *Writer {
	return &Writer{store: store, name: name, current: current, refresh: refresh, inflight: map[int64]int{}}
}

// Name returns the writer's name.
func (w *Writer) Name() string { return w.name }

// begin records a write placed under t.
func (w *Writer) begin(t Topology) {
	w.mu.Lock()
	w.inflight[t.Epoch]++
	w.mu.Unlock()
}

func (w *Writer) end(t Topology) {
	w.mu.Lock()
	if w.inflight[t.Epoch]--; w.inflight[t.Epoch] <= 0 {
		delete(w.inflight, t.Epoch)
	}
	w.mu.Unlock()
}

// Epoch returns the oldest epoch this writer may still write with: that of
// its topology, or older while a write placed under an older one is under
// way.
func (w *Writer) Epoch() int64 {
	e := w.current().Epoch
	w.mu.Lock()
	for ep := range w.inflight {
		e = min(e, ep)
	}
	w.mu.Unlock()
	return e
}

// Place groups es by their shard among n.
func Place(es []Entry, n int) map[int][]Entry {
	by := make(map[int][]Entry)
	for _, e := range es {
		i := Of(e.ID, n)
		by[i] = append(by[i], e)
	}
	return by
}

// Upsert places es under the writer's topology and pushes their deadlines
// forward, as Store.Upsert does, adding an absent id only if admit (nil:
// all) admits it. Entries a shard refuses (the writer lagged
// behind a drained doubling) are placed again under a freshly read topology
// and written there. It returns the ids that were absent. Like Store.Upsert
// it is idempotent and may be retried.
func (w *Writer) Upsert(ctx context.Context, f Family, es []Entry, admit Admit) ([]string, error) {
	var added []string
	err := placed(ctx, w, es, func(e Entry) string { return e.ID }, func(epoch int64, by map[int][]Entry) ([]int, error) {
		a, refused, err := w.store.upsertAt(ctx, f, epoch, by, admit)
		added = append(added, a...)
		return refused, err
	})
	return added, err
}

// placed places items (member given by id) under the writer's topology
// and writes them with write, which returns the shards that refused their
// part because the topology was old; those are placed again under a
// freshly read topology and written there.
func placed[T any](ctx context.Context, w *Writer, items []T, id func(T) string, write func(epoch int64, by map[int][]T) ([]int, error)) error {
	t := w.current()
	w.begin(t)
	defer func() { w.end(t) }()
	place := func(items []T, n int) map[int][]T {
		by := make(map[int][]T)
		for _, it := range items {
			i := Of(id(it), n)
			by[i] = append(by[i], it)
		}
		return by
	}
	by := place(items, t.Shards)
	for {
		refused, err := write(t.Epoch, by)
		if err != nil || len(refused) == 0 {
			return err
		}
		nt, err := w.refresh(ctx)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrStaleTopology, err)
		}
		if nt.Epoch <= t.Epoch {
			return fmt.Errorf("%w (epoch %d)", ErrStaleTopology, t.Epoch)
		}
		var again []T
		for _, i := range refused {
			again = append(again, by[i]...)
		}
		w.begin(nt)
		w.end(t)
		t, by = nt, place(again, nt.Shards)
	}
}

// EpochEvery is how often a writer reports its epoch when it has not
// changed; a change is reported within reportPoll.
const (
	EpochEvery = time.Second
	reportPoll = 50 * time.Millisecond
)

// Run reports the writer's epoch (within reportPoll of a change, and every
// EpochEvery anyway, so the drain knows it is alive) until ctx is done, then
// removes the report: a writer that left is not waited for. The caller owns
// the goroutine that runs it; it returns after the removal.
func (w *Writer) Run(ctx context.Context, now func() time.Time, log *slog.Logger) {
	if now == nil {
		now = time.Now
	}
	tick := time.NewTicker(reportPoll)
	defer tick.Stop()
	var (
		reported int64 = -1
		at       time.Time
	)
	for {
		if e := w.Epoch(); e != reported || time.Since(at) >= EpochEvery {
			rctx, cancel := context.WithTimeout(ctx, EpochEvery)
			err := w.store.reportWriter(rctx, w.name, e, now())
			cancel()
			if err == nil {
				reported, at = e, time.Now()
			} else if ctx.Err() == nil && log != nil && time.Since(at) > WriterTimeout/2 {
				log.Warn("writer epoch report failed", "writer", w.name, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			if err := w.store.leaveWriter(lctx, w.name); err != nil && log != nil {
				log.Warn("writer leave failed; its report expires by itself", "writer", w.name, "err", err)
			}
			return
		case <-tick.C:
		}
	}
}

// WriterTimeout is how long a writer's report counts: a writer silent for
// longer is taken for gone, and the drain no longer waits for it. Should it
// come back, the floors refuse what it placed under an old topology.
const WriterTimeout = 10 * time.Second

// WriterEpoch is the epoch a writer writes with, and when it said so.
type WriterEpoch struct {
	Epoch int64
	At    int64 // unix ms
}

// reportWriter records that writer name writes with epoch or later.
func (s *Store) reportWriter(ctx context.Context, name string, epoch int64, now time.Time) error {
	v := strconv.FormatInt(epoch, 10) + ":" + strconv.FormatInt(now.UnixMilli(), 10)
	return s.hashSet(ctx, s.k.Writers(), name, v, "report writer "+name)
}

// leaveWriter removes a writer that stopped writing.
func (s *Store) leaveWriter(ctx context.Context, name string) error {
	return s.hashDelete(ctx, s.k.Writers(), name, "leave writer "+name)
}

// Writers returns every writer's last report.
func (s *Store) Writers(ctx context.Context) (map[string]WriterEpoch, error) {
	return hashRecords(ctx, s, s.k.Writers(), "writers", func(name, v string) (string, WriterEpoch, bool) {
		a, b, _ := strings.Cut(v, ":")
		var r WriterEpoch
		r.Epoch, _ = strconv.ParseInt(a, 10, 64)
		r.At, _ = strconv.ParseInt(b, 10, 64)
		return name, r, true
	})
}

// WritersCurrent reports whether every writer heard from within
// WriterTimeout of now writes with epoch or later, and names the ones that
// do not.
func WritersCurrent(reports map[string]WriterEpoch, epoch int64, now time.Time) (ok bool, lagging []string) {
	for name, r := range reports {
		if r.At < now.Add(-WriterTimeout).UnixMilli() {
			continue
		}
		if r.Epoch < epoch {
			lagging = append(lagging, name)
		}
	}
	return len(lagging) == 0, lagging
}
