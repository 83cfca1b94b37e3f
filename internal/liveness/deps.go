package liveness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
)

// Deps knows which dependencies (Redis, NATS) are down, from probes of its
// own: the API answers 503 at once while one is, instead of making a
// caller wait for a client that retries, and the log groups an outage's
// warnings (ratelog.Handler). A probe that fails or gives no answer within
// probeLimit marks its dependency down until one succeeds. Each probe runs
// in a goroutine of its own, so a client that overstays its deadline
// cannot hide the outage.
type Deps struct {
	log  *slog.Logger
	deps []*dep
	wg   sync.WaitGroup
}

const (
	probeEvery = 250 * time.Millisecond
	probeLimit = time.Second
)

var noAnswer = fmt.Sprintf("no answer within %v", probeLimit)

// reasonOf is why the probe of name failed with err, in an operator's
// words: a timeout is no answer, whichever layer noticed it.
func reasonOf(name string, err error) string {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return noAnswer
	}
	return strings.TrimPrefix(err.Error(), name+": ")
}

type dep struct {
	name  string
	probe func(context.Context) error

	mu       sync.Mutex
	reason   string    // why it is down; "" while it answers
	since    time.Time // when it went down
	inflight time.Time // start of the probe under way, zero when none
}

// NewDeps returns a Deps without dependencies; Add them before Run.
func NewDeps(log *slog.Logger) *Deps { return &Deps{log: log} }

// Add watches the dependency name with probe.
func (d *Deps) Add(name string, probe func(context.Context) error) {
	d.deps = append(d.deps, &dep{name: name, probe: probe})
}

// Down reports whether the dependency name is down, and why. A Deps that
// is nil or does not watch name says it is up.
func (d *Deps) Down(name string) (reason string, down bool) {
	if d == nil {
		return "", false
	}
	for _, p := range d.deps {
		if p.name == name {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.reason, p.reason != ""
		}
	}
	return "", false
}

// First names the first dependency that is down ("" when none), in the
// order they were added.
func (d *Deps) First() string {
	if d == nil {
		return ""
	}
	for _, p := range d.deps {
		if _, down := d.Down(p.name); down {
			return p.name
		}
	}
	return ""
}

// Probe probes the dependency name now, waiting at most probeLimit, and
// reports whether it is down, and why: a caller whose call just failed
// learns at once whether the dependency is what failed it.
func (d *Deps) Probe(ctx context.Context, name string) (reason string, down bool) {
	if d == nil {
		return "", false
	}
	for _, p := range d.deps {
		if p.name != name {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, probeLimit)
		defer cancel()
		res := make(chan error, 1)
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			res <- p.probe(pctx)
		}()
		var err error
		select {
		case err = <-res:
		case <-pctx.Done():
			err = pctx.Err()
		}
		if err != nil && ctx.Err() == nil {
			p.mu.Lock()
			if p.reason == "" {
				d.set(p, reasonOf(p.name, err), time.Now())
			} else {
				p.mu.Unlock()
			}
		}
		return d.Down(name)
	}
	return "", false
}

// Run probes every dependency until ctx is done, then waits for the probes
// under way.
func (d *Deps) Run(ctx context.Context) error {
	defer d.wg.Wait()
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for {
		now := time.Now()
		for _, p := range d.deps {
			d.check(ctx, p, now)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// check starts a probe of p unless one is under way, and marks p down when
// the one under way has been waiting longer than probeLimit.
func (d *Deps) check(ctx context.Context, p *dep, now time.Time) {
	p.mu.Lock()
	if !p.inflight.IsZero() {
		if waited := now.Sub(p.inflight); waited > probeLimit && p.reason == "" {
			d.set(p, noAnswer, now)
			return
		}
		p.mu.Unlock()
		return
	}
	p.inflight = now
	p.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		pctx, cancel := context.WithTimeout(ctx, probeLimit)
		err := p.probe(pctx)
		cancel()
		p.mu.Lock()
		p.inflight = time.Time{}
		switch {
		case ctx.Err() != nil:
			p.mu.Unlock()
		case err != nil:
			d.set(p, reasonOf(p.name, err), time.Now())
		default:
			d.set(p, "", time.Now())
		}
	}()
}

// set records p's state and unlocks p.mu, then logs a change of up or
// down: the log handler asks Down, so it must not be called with p.mu held.
func (d *Deps) set(p *dep, reason string, now time.Time) {
	was := p.reason
	p.reason = reason
	if was == "" && reason != "" {
		p.since = now
	}
	since := p.since
	p.mu.Unlock()
	switch {
	case was == "" && reason != "":
		d.log.Warn(p.name+" unavailable", "reason", reason)
	case was != "" && reason == "":
		d.log.Info(p.name+" answering again", "down_for", now.Sub(since).Round(time.Millisecond).String())
	}
}
