package ratelog

import (
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxKeys bounds the keys a Limiter remembers; it forgets them all once it
// holds that many, so odd keys cannot grow it without bound.
const maxKeys = 64

// Limiter lets one line per period through for each key. It is safe for
// concurrent use.
type Limiter struct {
	every time.Duration
	now   func() time.Time

	mu   sync.Mutex
	keys map[string]*key
}

type key struct {
	lim  *rate.Limiter
	held int
}

// New returns a limiter of one line per every for each key, on the clock
// now (time.Now if nil).
func New(every time.Duration, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{every: every, now: now, keys: make(map[string]*key)}
}

// Allow reports whether a line about k may go out now and, if so, how many
// were held back since the last one.
func (l *Limiter) Allow(k string) (ok bool, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, found := l.keys[k]
	if !found {
		if len(l.keys) >= maxKeys {
			clear(l.keys)
		}
		e = &key{lim: rate.NewLimiter(rate.Every(l.every), 1)}
		l.keys[k] = e
	}
	if !e.lim.AllowN(l.now(), 1) {
		e.held++
		return false, 0
	}
	held, e.held = e.held, 0
	return true, held
}

// Warn logs msg at warning level unless a line about k went out less than
// a period ago; the line says how many were held back ("suppressed").
func (l *Limiter) Warn(log *slog.Logger, k, msg string, args ...any) {
	ok, held := l.Allow(k)
	if !ok {
		return
	}
	if held > 0 {
		args = append(args, "suppressed", held)
	}
	log.Warn(msg, args...)
}
