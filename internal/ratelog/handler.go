package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Every is the period of a process's log: at most one warning or error
// line per message per Every.
const Every = 10 * time.Second

// Handler limits the warnings and errors that go through it to one line
// per message per period, the line saying how many it held back
// ("suppressed", added to any count the caller's own limiter gave). While
// down names a dependency that is down, every warning shares one key, so a
// Redis or NATS outage reads as one line per period whatever the roles
// retry. Debug and info lines go through as they are.
type Handler struct {
	next slog.Handler
	s    *handlerState
}

type handlerState struct {
	every time.Duration
	now   func() time.Time
	down  func() string

	mu   sync.Mutex
	keys map[string]*held
}

type held struct {
	next time.Time // the earliest time the next line may go out
	n    int64     // lines held back since the last one
}

// NewHandler wraps next. down names a dependency that is down, or ""; nil
// means none ever is. now is the clock (time.Now if nil).
func NewHandler(next slog.Handler, every time.Duration, now func() time.Time, down func() string) *Handler {
	if now == nil {
		now = time.Now
	}
	if down == nil {
		down = func() string { return "" }
	}
	return &Handler{next: next, s: &handlerState{every: every, now: now, down: down, keys: map[string]*held{}}}
}

// Enabled is next's.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// WithAttrs shares the limit with h.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(as), s: h.s}
}

// WithGroup shares the limit with h.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), s: h.s}
}

// Handle passes r on, or holds it back when a line of its key went out
// less than a period ago.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	// A count the caller's own limiter gave is part of this line's.
	var inner int64
	var rest []slog.Attr
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "suppressed" && (a.Value.Kind() == slog.KindInt64 || a.Value.Kind() == slog.KindUint64) {
			inner += a.Value.Int64()
			return true
		}
		rest = append(rest, a)
		return true
	})
	key, during := r.Level.String()+" "+r.Message, ""
	if r.Level < slog.LevelError {
		if d := h.s.down(); d != "" {
			key, during = "down "+d, d+" unavailable"
		}
	}
	n, ok := h.s.allow(key, 1+inner)
	if !ok {
		return nil
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(rest...)
	if during != "" && during != r.Message {
		out.AddAttrs(slog.String("during", during))
	}
	if n+inner > 0 {
		out.AddAttrs(slog.Int64("suppressed", n+inner))
	}
	return h.next.Handle(ctx, out)
}

// allow reports whether a line of key may go out now and how many lines
// were held back since the last; a line held back counts lines.
func (s *handlerState) allow(key string, lines int64) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	k, ok := s.keys[key]
	if !ok {
		if len(s.keys) >= maxKeys {
			clear(s.keys)
		}
		k = &held{}
		s.keys[key] = k
	}
	if now.Before(k.next) {
		k.n += lines
		return 0, false
	}
	n := k.n
	k.n, k.next = 0, now.Add(s.every)
	return n, true
}
