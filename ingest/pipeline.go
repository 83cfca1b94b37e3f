package ingest

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/ratelog"
	"github.com/sigwatch/sigwatch/shard"
)

// pipeline is the stage that stores deadlines: it collects signals per
// shard, in the order they were received, cuts them into batches, and
// flushes each batch to Redis (ZADD GT), then acks its messages and
// welcomes the devices that were absent (first seen, or recovered). It
// tells the watermark stage where each probe barrier was cut and when each
// flush completed.
//
// Its senders are the source and Signal; they hand signals over with
// enqueue, which bounds what is in flight. close ends the input; run then
// stores what is in flight and returns.
type pipeline struct {
	opts   *Options
	topo   *shard.Watcher
	store  *shard.Store
	writer *shard.Writer
	// devices lowers the deadlines of offline reports.
	devices *shard.Devices
	pub     *dispatch.Bus // nil: recoveries are counted and logged only
	wm      *watermark
	log     *slog.Logger
	m       *metrics
	errLog  *ratelog.Limiter

	// slots bounds signals received but not yet stored and acked; a
	// sender that cannot take a slot waits, so the broker queues.
	slots chan struct{}
	// work carries signals and probe barriers, in the order received, to
	// the collector.
	work chan signal
	// gate orders senders against close: senders hold it shared while
	// they hand work over; close takes it to set closed and close work.
	gate   sync.RWMutex
	closed bool
	// order is held while a probe barrier or an API signal is stamped and
	// handed to work, so that no barrier overtakes an API signal stamped
	// before it (see enqueueStamped).
	order sync.Mutex
	// stopping is closed when close begins: senders waiting for a slot
	// give up and leave their message unacked.
	stopping chan struct{}
	// abandoned is set when signals were given up on while stopping.
	abandoned atomic.Bool
	// beats are the flush loops' liveness beats, one per loop.
	beats []func()
}

// signal is one unit of work on its way to Redis: a device's new deadline,
// and how to report that it is stored. A signal with probe set is instead
// the barrier of the watermark probe sent at that time.
type signal struct {
	id, typ, group string
	shard          int
	at             int64 // signal time, unix ms
	// lo is the evidence of the signal's age: the broker had it no earlier
	// than lo, unix ms (see source.onMessage). It is at when the signal's
	// own time is the evidence (Signal).
	lo       int64
	deadline int64 // unix ms
	msg      mqtt.Message
	done     chan error
	probe    int64
	// expired says deadline is one the device declared (ttd, next).
	expired bool
	// lower, when set, makes this an offline report, not a signal: the
	// reason the device is declared lost at at (see shard.Lowering); own
	// says it is the device's own word.
	lower string
	own   bool
}

// batch is the signals of one flush. seq numbers flushes in the order the
// collector cut them.
type batch struct {
	seq   uint64
	items []signal
}

// signal computes the deadline of one signal and the shard it goes to.
func (p *pipeline) signal(id, typ, group string, at time.Time, msg mqtt.Message, done chan error) signal {
	ms := at.UnixMilli()
	return signal{
		id:       id,
		typ:      typ,
		group:    group,
		shard:    shard.Of(id, p.topo.Current().Shards),
		at:       ms,
		lo:       ms,
		deadline: ms + p.opts.Thresholds.For(id, typ).Milliseconds(),
		msg:      msg,
		done:     done,
	}
}

// enqueue hands s to the collector once it has an in-flight slot. It hands
// nothing over, and returns an error, when the pipeline is stopping or ctx
// ends first.
func (p *pipeline) enqueue(ctx context.Context, s signal) error {
	return p.hand(ctx, func() signal { return s }, false)
}

// hand takes an in-flight slot, then builds the signal and sends it to the
// collector. With ordered, building and sending happen under order, which
// barriers are enqueued under too, so a signal stamped by build is never
// queued behind a barrier newer than its stamp.
func (p *pipeline) hand(ctx context.Context, build func() signal, ordered bool) error {
	p.gate.RLock()
	defer p.gate.RUnlock()
	if p.closed {
		return ErrStopped
	}
	select {
	case p.slots <- struct{}{}:
	case <-p.stopping:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	if ordered {
		p.order.Lock()
		defer p.order.Unlock()
	}
	select {
	case p.work <- build():
		return nil
	case <-p.stopping:
	case <-ctx.Done():
	}
	<-p.slots
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return ErrStopped
}

// enqueueBarrier hands the barrier of the probe sent at ms to the collector,
// in order with the signals received before it.
func (p *pipeline) enqueueBarrier(ms int64) {
	p.gate.RLock()
	defer p.gate.RUnlock()
	select {
	case <-p.stopping:
		// A signal before this probe may have been turned away unacked;
		// the probe must not vouch for it.
		return
	default:
	}
	if p.closed {
		return
	}
	p.order.Lock()
	defer p.order.Unlock()
	select {
	case p.work <- signal{probe: ms}:
	case <-p.stopping:
	}
}

// close ends the input: senders waiting for a slot give up, and later ones
// get ErrStopped.
func (p *pipeline) close() {
	close(p.stopping)
	p.gate.Lock()
	defer p.gate.Unlock()
	p.closed = true
	close(p.work)
}

// run collects and flushes until the input is closed and what was in it is
// stored (or abandoned once ctx ends), then stops the writer's reports, so
// that they outlive the last write. ctx bounds the Redis and NATS calls.
func (p *pipeline) run(ctx context.Context) {
	writerCtx, stopWriter := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWriter()
	var reporting sync.WaitGroup
	reporting.Go(func() { p.writer.Run(writerCtx, p.opts.Now, p.log) })

	// The collector closes flushes when work is closed and drained; the
	// flushers end once flushes is.
	flushes := make(chan *batch, flushers)
	var flushing sync.WaitGroup
	flushing.Go(func() { p.collect(flushes) })
	for _, beat := range p.beats {
		flushing.Go(func() { p.flusher(ctx, flushes, beat) })
	}
	flushing.Wait()
	stopWriter()
	reporting.Wait()
}

// collect groups signals into batches, in the order they were received, and
// hands each batch to the flushers when one of its shards holds Batch
// signals, when its oldest signal has waited FlushInterval, or when a probe
// barrier arrives. It returns, closing flushes, once work is closed.
func (p *pipeline) collect(flushes chan<- *batch) {
	defer close(flushes)
	var (
		b      = &batch{items: make([]signal, 0, p.opts.Batch)}
		counts []int // signals per shard in b
		seq    uint64
		timer  = time.NewTimer(time.Hour)
	)
	timer.Stop()
	defer timer.Stop()
	cut := func() {
		if len(b.items) == 0 {
			return
		}
		timer.Stop()
		seq++
		b.seq = seq
		flushes <- b
		b = &batch{items: make([]signal, 0, p.opts.Batch)}
		clear(counts)
	}
	for {
		select {
		case s, ok := <-p.work:
			if !ok {
				cut()
				return
			}
			if s.probe != 0 {
				// Every signal received before the probe is in a batch
				// numbered seq or lower once this cut is made.
				cut()
				p.wm.barrier(seq, s.probe)
				continue
			}
			if len(b.items) == 0 {
				timer.Reset(p.opts.FlushInterval)
			}
			b.items = append(b.items, s)
			if s.shard >= len(counts) {
				counts = append(counts, make([]int, s.shard+1-len(counts))...)
			}
			counts[s.shard]++
			if counts[s.shard] >= p.opts.Batch {
				cut()
			}
		case <-timer.C:
			cut()
		}
	}
}

// flusher stores batches until flushes is closed, beating at each batch
// and every idleBeat while it waits.
func (p *pipeline) flusher(ctx context.Context, flushes <-chan *batch, beat func()) {
	idx := make(map[string]int)
	var es []shard.Entry
	tick := time.NewTicker(idleBeat)
	defer tick.Stop()
	for {
		beat()
		select {
		case b, ok := <-flushes:
			if !ok {
				return
			}
			es = p.flush(ctx, b, idx, es[:0], beat)
		case <-tick.C:
		}
	}
}
