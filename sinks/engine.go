package sinks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/backoff"
)

// States of a sink, as GET /v1/sinks shows them.
const (
	StateOK       = "ok"
	StateRetrying = "retrying"
	StateDisabled = "disabled"
)

// sink delivers one configured sink's notifications: its durable consumer
// hands them over one at a time, in the order they were published; each
// is routed, de-duplicated, paced by the sink's budget and delivered,
// retried while the sink may take it later, and acknowledged only once
// the sink took it, refused it (dead letter) or the retry budget ran out
// (dead letter).
type sink struct {
	cfg   Config
	drv   driver
	cons  *dispatch.SinkConsumer
	st    *state
	pub   *dispatch.Bus
	m     *metrics
	log   *slog.Logger
	now   func() time.Time
	storm func(ctx context.Context, scope string, limit int) ([]string, int, error)

	mu       sync.Mutex
	status   string
	lastErr  string
	lastSent time.Time
	queue    int64
}

// retryBackoff paces the retries of one notification when the sink names
// no wait of its own.
var retryBackoff = backoff.Policy{Base: time.Second, Max: 5 * time.Minute}

// run delivers until ctx ends or the sink is disabled.
func (s *sink) run(ctx context.Context) error {
	for {
		msg, err := s.cons.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if disabled := s.handle(ctx, msg); disabled {
			return nil
		}
	}
}

// handle carries one notification to its end, and reports whether the
// sink is now disabled.
func (s *sink) handle(ctx context.Context, msg dispatch.SinkMsg) (disabled bool) {
	n, err := decode(msg)
	if err != nil {
		s.log.Error("sink: notification unreadable; dropped", "sink", s.cfg.Name, "subject", msg.Subject, "err", err)
		s.m.sent(s.cfg.Name, "unreadable")
		_ = msg.Drop()
		return false
	}
	if !s.cfg.routes(n) || !s.drv.wants(n) {
		s.m.sent(s.cfg.Name, "skipped")
		_ = msg.Ack()
		return false
	}
	if done, err := s.st.sent(ctx, n.ID); err == nil && done {
		s.m.sent(s.cfg.Name, "duplicate")
		_ = msg.Ack()
		return false
	}
	s.withDevices(ctx, &n)
	first := s.now()
	for attempt := 1; ; attempt++ {
		if err := s.st.pace(ctx, s.cfg.rate(), s.m.budgetWait(s.cfg.Name)); err != nil {
			// Without Redis the budget cannot be kept across replicas:
			// wait for it rather than send past it.
			if ctx.Err() != nil || !s.hold(ctx, msg, time.Second) {
				_ = msg.Release()
				return false
			}
			s.failing(fmt.Errorf("the budget is kept in Redis, which does not answer: %w", err))
			continue
		}
		start := s.now()
		err := s.drv.deliver(ctx, n)
		s.m.latency(s.cfg.Name, s.now().Sub(start))
		var retry *RetryError
		var refused *RefusedError
		switch {
		case err == nil:
			_ = s.st.markSent(ctx, n.ID)
			s.keepOpen(ctx, n)
			_ = msg.Ack()
			s.ok()
			s.m.sent(s.cfg.Name, "sent")
			return false
		case errors.Is(err, ErrGone):
			s.disable(ctx, err)
			_ = msg.Release()
			return true
		case errors.As(err, &refused):
			s.deadLetter(ctx, msg, n, err, attempt)
			return false
		case errors.As(err, &retry):
			if s.now().Sub(first) >= s.cfg.RetryFor {
				s.deadLetter(ctx, msg, n, err, attempt)
				return false
			}
			wait := max(retry.After, retryBackoff.Delay(attempt-1))
			s.failing(err)
			s.m.sent(s.cfg.Name, "retried")
			if !s.hold(ctx, msg, wait) {
				_ = msg.Release()
				return false
			}
		default:
			s.deadLetter(ctx, msg, n, err, attempt)
			return false
		}
	}
}

// hold waits d, telling the stream the notification is still in hand.
func (s *sink) hold(ctx context.Context, msg dispatch.SinkMsg, d time.Duration) bool {
	tick := time.NewTicker(max(s.cfg.AckWait/3, time.Second))
	defer tick.Stop()
	end := time.NewTimer(d)
	defer end.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-end.C:
			return true
		case <-tick.C:
			_ = msg.Working()
		}
	}
}

// withDevices lists the storm's devices on a group's or the fleet's alarm.
func (s *sink) withDevices(ctx context.Context, n *Notification) {
	a := n.Alarm
	if a == nil || a.Device != "" || s.storm == nil {
		return
	}
	scope := "fleet"
	if a.Group != "" {
		scope = "group:" + a.Group
	}
	devs, total, err := s.storm(ctx, scope, MaxDevices)
	if err != nil {
		s.log.Warn("sink: the storm's devices could not be read; sent without them", "sink", s.cfg.Name, "err", err)
		return
	}
	n.Devices, n.More = devs, max(total-len(devs), 0)
}

// keepOpen remembers, for sinks that re-send open alarms (Alertmanager),
// the latest notification of each alarm until it is resolved.
func (s *sink) keepOpen(ctx context.Context, n Notification) {
	if s.cfg.Type != TypeAlertmanager || n.Alarm == nil || n.Test {
		return
	}
	key := alarmKey(n.Alarm)
	if n.Alarm.State == "resolved" {
		_ = s.st.close(ctx, key)
		return
	}
	b, err := json.Marshal(n)
	if err == nil {
		_ = s.st.open(ctx, key, b)
	}
}

// deadLetter publishes n on the sink's dead-letter subject and acks it.
func (s *sink) deadLetter(ctx context.Context, msg dispatch.SinkMsg, n Notification, err error, attempts int) {
	ev := dispatch.SinkFailure{ID: "sinkfail/" + s.cfg.Name + "/" + n.ID, Sink: s.cfg.Name, Subject: msg.Subject, EventID: n.ID,
		Error: err.Error(), Attempts: attempts, At: s.now().UnixMilli(), Event: msg.Data}
	m, encErr := dispatch.Encode(s.pub.Subjects(), ev)
	if encErr == nil {
		for _, perr := range s.pub.Publish(ctx, []dispatch.Message{m}) {
			encErr = perr
		}
	}
	if encErr != nil {
		s.log.Error("sink: dead letter not published; the notification is delivered again", "sink", s.cfg.Name, "id", n.ID, "err", encErr)
		_ = msg.Release()
		return
	}
	s.log.Error("sink: notification given up on; on the dead-letter subject", "sink", s.cfg.Name, "id", n.ID,
		"subject", s.pub.Subjects().SinkFailed(s.cfg.Name), "attempts", attempts, "err", err)
	s.m.sent(s.cfg.Name, "failed")
	_ = msg.Ack()
	s.failing(err)
}

// disable stops the sink for good (until the process restarts) and says
// so: a log line and a system event.
func (s *sink) disable(ctx context.Context, err error) {
	s.mu.Lock()
	s.status, s.lastErr = StateDisabled, err.Error()
	s.mu.Unlock()
	s.publishStatus()
	s.m.sent(s.cfg.Name, "gone")
	s.log.Error("sink disabled: its endpoint is gone; notifications wait in the stream until it is configured again and sigwatch restarted",
		"sink", s.cfg.Name, "type", s.cfg.Type, "err", err)
	at := s.now().UnixMilli()
	ev := dispatch.System{ID: fmt.Sprintf("sink_disabled@%s@%d", s.cfg.Name, at), Kind: "sink_disabled", At: at,
		Details: map[string]any{"sink": s.cfg.Name, "type": s.cfg.Type, "error": err.Error()}}
	if m, err := dispatch.Encode(s.pub.Subjects(), ev); err == nil {
		s.pub.Publish(ctx, []dispatch.Message{m})
	}
}

func (s *sink) ok() {
	s.mu.Lock()
	s.status, s.lastSent = StateOK, s.now()
	s.mu.Unlock()
	s.publishStatus()
}

func (s *sink) failing(err error) {
	s.mu.Lock()
	if s.status != StateDisabled {
		s.status = StateRetrying
	}
	s.lastErr = err.Error()
	s.mu.Unlock()
	s.publishStatus()
}

// publishStatus records the sink's state for every replica's API.
func (s *sink) publishStatus() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.st.saveStatus(ctx, s.view()); err != nil {
		s.log.Warn("sink: state not recorded", "sink", s.cfg.Name, "err", err)
	}
}

// decode reads a notification from its message.
func decode(msg dispatch.SinkMsg) (Notification, error) {
	n := Notification{ID: msg.ID}
	if strings.HasSuffix(msg.Subject, ".storm") {
		var ev dispatch.Storm
		if err := json.Unmarshal(msg.Data, &ev); err != nil {
			return n, err
		}
		n.Storm = &ev
	} else {
		var ev dispatch.Alarm
		if err := json.Unmarshal(msg.Data, &ev); err != nil {
			return n, err
		}
		n.Alarm = &ev
	}
	if n.ID == "" {
		return n, errors.New("no Nats-Msg-Id")
	}
	return n, nil
}
