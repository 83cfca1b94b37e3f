package dispatch

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/internal/ratelog"
)

// DefaultMaxTypes is the default nats.max_types: how many device types
// beyond the configured ones get a subject token of their own.
const DefaultMaxTypes = 100

// OtherType is the subject token of the events of every device type beyond
// nats.max_types. The event body keeps the type as given.
const OtherType = "other"

// typeTokens bounds the subjects device types can create. Device types
// come from devices (a topic level, a payload field), so without a bound a
// fleet could create any number of subjects, each costing the stream and
// every consumer's filter state. The configured types always have their
// own token; the first max others seen by this process get one too; the
// rest publish under OtherType, counted and logged.
type typeTokens struct {
	mu    sync.Mutex
	known map[string]bool // tokens with a subject of their own
	free  int             // tokens that may still be admitted
	over  prometheus.Counter
	log   *slog.Logger
	warn  *ratelog.Limiter
	// runtime reports the types configured at run time (PUT
	// /v1/types/{type}): like thresholds.types, each has a token of its own.
	runtime atomic.Pointer[func(typ string) bool]
}

func newTypeTokens(configured []string, max int, reg prometheus.Registerer, log *slog.Logger) (*typeTokens, error) {
	t := &typeTokens{known: map[string]bool{"default": true, OtherType: true}, free: max, log: log,
		warn: ratelog.New(time.Minute, nil),
		over: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sigwatch", Subsystem: "dispatch",
			Name: "type_overflow_total",
			Help: "Events published under the subject token \"other\" because their device type is beyond nats.max_types."})}
	for _, typ := range configured {
		t.known[SanitizeType(typ)] = true
	}
	if reg != nil {
		if err := reg.Register(t.over); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// ConfiguredTypes tells the publisher which device types are configured
// at run time (f reports them): each gets a subject token of its own, as
// the types of thresholds.types do, beyond nats.max_types.
func (p *Bus) ConfiguredTypes(f func(typ string) bool) {
	if p.subjects.types != nil {
		p.subjects.types.runtime.Store(&f)
	}
}

// token is the subject token of typ.
func (t *typeTokens) token(typ string) string {
	tok, over := t.admit(typ)
	if !over {
		return tok
	}
	t.over.Inc()
	if t.log != nil {
		t.warn.Warn(t.log, "types", "device type beyond nats.max_types: its events go out under the subject token \"other\" (the body keeps the type); configure the type under thresholds.types or at run time (PUT /v1/types/{type}), or raise nats.max_types",
			"type", SanitizeType(typ))
	}
	return OtherType
}

// admit returns the subject token of typ, admitting it if there is room,
// and whether it is OtherType because there was none.
func (t *typeTokens) admit(typ string) (string, bool) {
	tok := SanitizeType(typ)
	if t == nil {
		return tok, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	rt := t.runtime.Load()
	switch {
	case t.known[tok]:
		return tok, false
	case rt != nil && (*rt)(typ):
		t.known[tok] = true
		return tok, false
	case t.free > 0:
		t.free--
		t.known[tok] = true
		return tok, false
	}
	return OtherType, true
}
