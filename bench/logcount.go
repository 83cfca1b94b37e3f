package bench

import (
	"context"
	"log/slog"
	"os"
	"sync"
)

// warnLog is a logger for the sigwatch components the harness runs: it
// writes to a file in the servers' directory and remembers the warnings and
// errors, so a run can say that, for example, ingest lost its connection.
type warnLog struct {
	mu    sync.Mutex
	count int
	first string
	f     *os.File
}

func newWarnLog(path string) (*warnLog, *slog.Logger) {
	w := &warnLog{}
	var h slog.Handler = slog.DiscardHandler
	if f, err := os.Create(path); err == nil {
		w.f = f
		h = slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo})
	}
	return w, slog.New(&warnHandler{Handler: h, w: w})
}

// summary returns how many warnings were logged and the first of them.
func (w *warnLog) summary() (int, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.count, w.first
}

func (w *warnLog) close() {
	if w.f != nil {
		w.f.Close()
	}
}

type warnHandler struct {
	slog.Handler
	w *warnLog
}

func (h *warnHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.w.mu.Lock()
		h.w.count++
		if h.w.first == "" {
			h.w.first = r.Message
			r.Attrs(func(a slog.Attr) bool {
				h.w.first += " " + a.String()
				return true
			})
		}
		h.w.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

func (h *warnHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &warnHandler{Handler: h.Handler.WithAttrs(as), w: h.w}
}

func (h *warnHandler) WithGroup(name string) slog.Handler {
	return &warnHandler{Handler: h.Handler.WithGroup(name), w: h.w}
}
