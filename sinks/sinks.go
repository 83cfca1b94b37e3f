package sinks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/backoff"
	"github.com/sigwatch/sigwatch/shard"
)

// Options configure the sinks of one process.
type Options struct {
	Sinks []Config
	Store *shard.Store
	Pub   *dispatch.Bus
	// StormDevices lists a storm's lost devices (alarm.Alarms.StormDevices);
	// nil: scope alarms go out without them.
	StormDevices func(ctx context.Context, scope string, limit int) ([]string, int, error)
	// AckWait is how long a replica that stopped answering holds a
	// notification before another takes it (alarm.ack_wait); 0: 30 s.
	AckWait    time.Duration
	Registerer prometheus.Registerer
	Log        *slog.Logger
	Now        func() time.Time    // nil: time.Now
	Getenv     func(string) string // nil: os.Getenv
	Client     func(*http.Client)  // adjusts the HTTP client (tests)
}

// Sinks deliver the alarm notifications and storm events to where people
// see them: each configured sink has a durable consumer shared by every
// replica that runs it.
type Sinks struct {
	// tr carries every sink's calls; idle connections close soon, and
	// all of them when Run returns.
	tr    *http.Transport
	sinks []*sink
	byKey map[string]*sink
	log   *slog.Logger
}

// ErrUnknown: no sink has that name.
var ErrUnknown = errors.New("no sink of that name")

// New builds the configured sinks: their secrets are read and their
// consumers created now, so that a sink that cannot work stops the start.
func New(ctx context.Context, o Options) (*Sinks, error) {
	if err := Validate(o.Sinks); err != nil {
		return nil, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.IdleConnTimeout = 2 * time.Second
	out := &Sinks{tr: tr, byKey: map[string]*sink{}, log: o.Log}
	for _, c := range o.Sinks {
		if c.AckWait == 0 {
			c.AckWait = o.AckWait
		}
		c = c.withDefaults()
		sec, err := c.resolve(o.Getenv)
		if err != nil {
			return nil, err
		}
		client := &http.Client{Timeout: c.Timeout, Transport: tr}
		if o.Client != nil {
			o.Client(client)
		}
		var d driver
		switch c.Type {
		case TypeAlertmanager:
			d = newAlertmanager(sec.url, 4*c.Resend, client)
		case TypePagerDuty:
			d = newPagerDuty(sec.url, sec.routingKey, client)
		case TypeSlack:
			d = newSlack(sec.url, client)
		case TypeWebhook:
			d = newWebhook(sec.url, sec.signing, client)
		}
		cons, err := o.Pub.NewSinkConsumer(ctx, c.Name, c.AckWait)
		if err != nil {
			return nil, err
		}
		s := &sink{cfg: c, drv: d, cons: cons, st: &state{store: o.Store, name: c.Name, now: o.Now}, pub: o.Pub, m: m,
			log: o.Log, now: o.Now, storm: o.StormDevices, status: StateOK}
		out.sinks = append(out.sinks, s)
		out.byKey[c.Name] = s
	}
	return out, nil
}

// Run delivers until ctx ends. A sink whose consumer fails is started
// again after a pause; a disabled one stays stopped.
func (ss *Sinks) Run(ctx context.Context) error {
	defer ss.tr.CloseIdleConnections()
	g, ctx := errgroup.WithContext(ctx)
	for _, s := range ss.sinks {
		g.Go(func() error {
			for attempt := 0; ; attempt++ {
				err := s.run(ctx)
				if ctx.Err() != nil || s.disabled() {
					return nil
				}
				s.log.Warn("sink: consuming failed; starting again", "sink", s.cfg.Name, "err", err)
				if !backoff.Wait(ctx, retryBackoff.Delay(min(attempt, 6))) {
					return nil
				}
			}
		})
		g.Go(func() error { s.watchDepth(ctx); return nil })
		if s.cfg.Type == TypeAlertmanager {
			g.Go(func() error { s.resendOpen(ctx); return nil })
		}
	}
	return g.Wait()
}

// View is a sink as GET /v1/sinks shows it.
type View struct {
	Name      string  `json:"name"`
	Type      string  `json:"type"`
	State     string  `json:"state"`
	Queue     int64   `json:"queue"`
	Rate      float64 `json:"rate"`
	LastError string  `json:"last_error,omitempty"`
	LastSent  int64   `json:"last_sent,omitempty"`
}

// List returns every sink's view, in configured order, as the replica
// delivering it last recorded it.
func (ss *Sinks) List(ctx context.Context) ([]View, error) {
	out := make([]View, 0, len(ss.sinks))
	for _, s := range ss.sinks {
		v := s.view()
		if err := s.st.loadStatus(ctx, &v); err != nil {
			return nil, err
		}
		if n, err := s.cons.Pending(ctx); err == nil {
			v.Queue = n
		}
		out = append(out, v)
	}
	return out, nil
}

// TestResult is what a test notification got from the sink.
type TestResult struct {
	Sink  string `json:"sink"`
	OK    bool   `json:"ok"`
	ID    string `json:"id"`
	Error string `json:"error,omitempty"`
}

// Test sends sink name a clearly marked test notification, past its
// budget and queue, and reports the sink's answer.
func (ss *Sinks) Test(ctx context.Context, name string) (TestResult, error) {
	s, ok := ss.byKey[name]
	if !ok {
		return TestResult{}, fmt.Errorf("%w: %q", ErrUnknown, name)
	}
	id := "sigwatch-test-" + strconv.FormatInt(s.now().UnixNano(), 36)
	err := s.drv.deliver(ctx, Notification{ID: id, Test: true})
	res := TestResult{Sink: name, OK: err == nil, ID: id}
	if err != nil {
		res.Error = err.Error()
	}
	return res, nil
}

func (s *sink) view() View {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := View{Name: s.cfg.Name, Type: s.cfg.Type, State: s.status, Queue: s.queue, Rate: s.cfg.Rate, LastError: s.lastErr}
	if !s.lastSent.IsZero() {
		v.LastSent = s.lastSent.UnixMilli()
	}
	return v
}

func (s *sink) disabled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status == StateDisabled
}

// watchDepth keeps the queue depth gauge and view current.
func (s *sink) watchDepth(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		if n, err := s.cons.Pending(ctx); err == nil {
			s.mu.Lock()
			s.queue = n
			s.mu.Unlock()
			s.m.depth.WithLabelValues(s.cfg.Name).Set(float64(n))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// resendOpen sends Alertmanager the open alarms again every Resend (one
// replica a turn), each with an end further on, so that Alertmanager
// never ends an alert whose alarm is still open.
func (s *sink) resendOpen(ctx context.Context) {
	t := time.NewTicker(s.cfg.Resend)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.disabled() || !s.st.resendTurn(ctx, s.cfg.Resend) {
			continue
		}
		open, err := s.st.opened(ctx)
		if err != nil {
			continue
		}
		for _, raw := range open {
			var n Notification
			if json.Unmarshal([]byte(raw), &n) != nil {
				continue
			}
			if err := s.drv.deliver(ctx, n); err != nil {
				s.failing(err)
				break
			}
		}
	}
}
