package ingest

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// logLimit lets through one log line per interval and counts the ones it
// held back, so the line that does go out can say how many there were.
type logLimit struct {
	lim        *rate.Limiter
	suppressed atomic.Int64
}

func newLogLimit(every time.Duration) *logLimit {
	return &logLimit{lim: rate.NewLimiter(rate.Every(every), 1)}
}

// allow reports whether a line may be logged at now and, if so, how many
// were held back since the last one.
func (l *logLimit) allow(now time.Time) (ok bool, suppressed int64) {
	if !l.lim.AllowN(now, 1) {
		l.suppressed.Add(1)
		return false, 0
	}
	return true, l.suppressed.Swap(0)
}

// keyedLimit lets through one log line per interval for each key (a reason
// that changes is logged at once). It forgets every key once it holds
// maxKeys, so odd keys cannot grow it without bound.
type keyedLimit struct {
	every time.Duration
	mu    sync.Mutex
	lims  map[string]*rate.Limiter
}

const maxKeys = 64

func newKeyedLimit(every time.Duration) *keyedLimit {
	return &keyedLimit{every: every, lims: make(map[string]*rate.Limiter)}
}

// allow reports whether a line about key may be logged at now.
func (k *keyedLimit) allow(key string, now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	lim, ok := k.lims[key]
	if !ok {
		if len(k.lims) >= maxKeys {
			clear(k.lims)
		}
		lim = rate.NewLimiter(rate.Every(k.every), 1)
		k.lims[key] = lim
	}
	return lim.AllowN(now, 1)
}
