package clock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/internal/periodic"
	"github.com/sigwatch/sigwatch/internal/ratelog"
)

// Source reads the reference clock: Redis server time (shard.Store.Time).
type Source func(ctx context.Context) (time.Time, error)

// Config is how the offset to the reference clock is measured.
type Config struct {
	// Every is the refresh period of the offset.
	Every time.Duration
	// Samples is the number of round trips one refresh takes.
	Samples int
	// WarnOffset is the offset beyond which the host's clock is reported
	// as wrong in the log.
	WarnOffset time.Duration
}

// DefaultConfig is the only copy of the clock's defaults.
func DefaultConfig() Config {
	return Config{Every: 30 * time.Second, Samples: 5, WarnOffset: time.Second}
}

// Options configure a Clock. Zero values of Config select DefaultConfig's.
type Options struct {
	Config
	// Skew is added to the local clock. It exists only so that tests can
	// run processes whose host clocks disagree; nothing else sets it.
	Skew time.Duration
}

func (o *Options) defaults() {
	d := DefaultConfig()
	o.Every = cmp.Or(max(o.Every, 0), d.Every)
	o.Samples = cmp.Or(max(o.Samples, 0), d.Samples)
	o.WarnOffset = cmp.Or(max(o.WarnOffset, 0), d.WarnOffset)
}

// Clock is the process's time base. It is safe for concurrent use.
type Clock struct {
	opts Options
	src  Source
	log  *slog.Logger
	warn *ratelog.Limiter
	m    *metrics

	// start is the local time at New, with its monotonic reading: the
	// local clock is start plus the monotonic time since, so a step of
	// the host's wall clock moves nothing.
	start  time.Time
	offset atomic.Int64 // ns from the local clock to the reference
	unc    atomic.Int64 // ns, half the round trip of the offset's sample
	synced atomic.Bool  // an offset was estimated at least once
	last   atomic.Int64 // the latest Now returned, unix ns
}

// New returns a clock on src. Until Sync succeeds it reads the local
// clock. reg and log may be nil.
func New(src Source, opts Options, reg prometheus.Registerer, log *slog.Logger) (*Clock, error) {
	opts.defaults()
	if src == nil {
		return nil, errors.New("clock: a source is required")
	}
	reg = cmp.Or(reg, prometheus.Registerer(prometheus.NewRegistry()))
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	return &Clock{opts: opts, src: src, log: log, warn: ratelog.New(10*time.Minute, nil), m: m, start: time.Now()}, nil
}

// local is the host's clock as this process keeps it: monotonic since
// start, plus the test skew.
func (c *Clock) local() time.Time {
	return c.start.Add(time.Since(c.start) + c.opts.Skew)
}

// Now returns the reference time as this process estimates it. After the
// first Sync it never returns an earlier time than it returned before.
func (c *Clock) Now() time.Time {
	t := c.local().UnixNano() + c.offset.Load()
	for {
		last := c.last.Load()
		if t <= last {
			return time.Unix(0, last)
		}
		if c.last.CompareAndSwap(last, t) {
			return time.Unix(0, t)
		}
	}
}

// Offset returns the offset from the local clock to the reference, and
// its uncertainty (half the round trip of the sample it came from).
func (c *Clock) Offset() (offset, uncertainty time.Duration) {
	return time.Duration(c.offset.Load()), time.Duration(c.unc.Load())
}

// sample is one TIME round trip.
type sample struct {
	offset, rtt time.Duration
}

// Sync estimates the offset from Opts.Samples round trips and applies the
// one with the smallest round trip. It fails only if every round trip
// failed; the offset in force then stays.
func (c *Clock) Sync(ctx context.Context) error {
	var (
		best sample
		ok   bool
		errs []error
	)
	for range c.opts.Samples {
		t0 := c.local()
		ref, err := c.src(ctx)
		t1 := c.local()
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		rtt := t1.Sub(t0)
		s := sample{offset: ref.Sub(t0.Add(rtt / 2)), rtt: rtt}
		if !ok || s.rtt < best.rtt {
			best, ok = s, true
		}
	}
	if !ok {
		c.m.errors.Inc()
		return fmt.Errorf("clock: read the reference clock: %w", errors.Join(errs...))
	}
	prev := time.Duration(c.offset.Swap(int64(best.offset)))
	c.unc.Store(int64(best.rtt / 2))
	first := !c.synced.Swap(true)
	if first {
		// Readings before the first estimate were local time, which is
		// not the time base: nothing holds Now back to them.
		c.last.Store(0)
	}
	c.m.set(best)
	if !first && absDur(best.offset-prev) > c.opts.WarnOffset {
		c.log.Warn("the time base moved: Redis server time or this host's clock was stepped",
			"step", (best.offset - prev).String(), "offset", best.offset.String())
	}
	if unc := best.rtt / 2; unc > c.opts.WarnOffset/4 {
		c.warn.Warn(c.log, "uncertainty", "round trips to Redis are slow: this process's clock may be off Redis time by up to "+
			"the uncertainty, and sigwatch assumes its processes agree within 1s", "uncertainty", unc.String())
	}
	if absDur(best.offset) > c.opts.WarnOffset {
		c.warn.Warn(c.log, "offset", "this host's clock differs from Redis server time; sigwatch runs on Redis time, "+
			"but check the host's time sync (NTP)", "offset", best.offset.String(), "uncertainty", (best.rtt / 2).String())
	}
	return nil
}

// Run refreshes the offset every Opts.Every until ctx is done. A failed
// refresh keeps the offset in force: the local clock drifts from it only
// slowly.
func (c *Clock) Run(ctx context.Context) {
	periodic.Run(ctx, c.opts.Every, func(time.Time) {
		sctx, cancel := context.WithTimeout(ctx, c.opts.Every/2)
		defer cancel()
		if err := c.Sync(sctx); err != nil && ctx.Err() == nil {
			c.warn.Warn(c.log, "sync", "clock refresh failed; keeping the last offset", "err", err)
		}
	})
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
