package api

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/guard"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/liveness"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/sinks"
	"github.com/sigwatch/sigwatch/stats"
	"github.com/sigwatch/sigwatch/timer"
)

// Config is the http section: the admin API and metrics listener.
type Config struct {
	Addr string `yaml:"addr"`
	// Token is the admin token of installations from before roles: it
	// keeps working as a token named http.token with the admin role.
	Token string `yaml:"token"`
	// Tokens are the named tokens, each with a role (see auth.go).
	Tokens []TokenConfig `yaml:"tokens"`
	// TLS serves HTTPS when its cert_file is set (see serve.go).
	TLS ServerTLS `yaml:"tls"`
	// MetricsAuth is "open" (the default) or "token": /metrics then needs
	// a token of any role.
	MetricsAuth string `yaml:"metrics_auth"`
	// RequestTimeout is the longest a /v1 request waits for its answer
	// before it is answered 503; while Redis or NATS is down the answer
	// comes sooner, naming it.
	RequestTimeout time.Duration `yaml:"request_timeout"`
}

// DefaultConfig listens on loopback only, where no token is needed.
func DefaultConfig() Config {
	return Config{Addr: "127.0.0.1:8080", MetricsAuth: "open", RequestTimeout: 10 * time.Second}
}

// Validate refuses an API open to the network without a token.
func (c Config) Validate() error {
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return fmt.Errorf("http.addr %q: %v", c.Addr, err)
	}
	if c.RequestTimeout <= 0 {
		return fmt.Errorf("http.request_timeout %v: give a positive duration, e.g. 10s", c.RequestTimeout)
	}
	if !isLoopback(host) && c.Token == "" && len(c.Tokens) == 0 {
		return fmt.Errorf("http.addr %s is not loopback: set http.tokens or http.token (SIGWATCH_HTTP_TOKEN) so the API is not open to the network", c.Addr)
	}
	switch c.MetricsAuth {
	case "open", "":
	case "token":
		if c.Token == "" && len(c.Tokens) == 0 {
			return fmt.Errorf("http.metrics_auth token: set http.tokens (a token with the metrics role, or any other) for Prometheus to scrape with")
		}
	default:
		return fmt.Errorf("http.metrics_auth %q: want open or token", c.MetricsAuth)
	}
	if _, err := resolveTokens(c, os.Getenv); err != nil {
		return err
	}
	return c.TLS.validate()
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Options are the http section and what the routes serve. The pointers a
// process may lack are nil then, and their routes answer 503.
type Options struct {
	Config
	// MaxIDLen is ingest.max_id_len: the API refuses ids ingest would.
	MaxIDLen int
	Store    *shard.Store
	Devices  *shard.Devices
	Pub      *dispatch.Bus
	Guard    *guard.Guard
	Stats    *stats.Fleet
	Registry *dispatch.Registry // nil in NATS core mode
	Ingest   *ingest.Ingest     // nil without the ingest role
	Alarms   *alarm.Alarms      // nil in NATS core mode
	Timers   *timer.Service     // nil when timers.enabled is off
	Sinks    *sinks.Sinks       // nil when none are configured
	// Gatherer serves /metrics; Stalled lists the loops that make no
	// progress, for /healthz.
	Gatherer   prometheus.Gatherer
	Registerer prometheus.Registerer
	Stalled    func() []string
	// Deps says whether Redis or NATS is down (nil: never), for the
	// deadline of every /v1 request and /readyz.
	Deps *liveness.Deps
	Now  func() time.Time
	Log  *slog.Logger
}

// API is the admin API of one process.
type API struct {
	o        Options
	tokens   *tokenSet
	throttle *throttle
	m        *metrics
	auditM   auditMetrics
	auditQ   *auditQueue
}

// New returns the API serving o. A token that can no longer be read (its
// variable or file changed since the configuration was checked) is not
// accepted, and the error is logged.
func New(o Options) *API {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	a := &API{o: o, tokens: &tokenSet{cfg: o.Config, getenv: os.Getenv}, throttle: newThrottle(), m: newMetrics(o.Registerer),
		auditM: newAuditMetrics(o.Registerer)}
	a.auditQ = &auditQueue{store: a.storeAudits, max: auditKept}
	if err := a.tokens.reload(); err != nil {
		o.Log.Error("http tokens", "err", err)
	}
	return a
}

// Reload reads the tokens of http.tokens again, from their variables and
// files: a token is added, rotated or revoked without a restart. On an
// error the tokens in force stay.
func (a *API) Reload() error { return a.tokens.reload() }

// Handler is every route of Routes, each behind the role it declares, with
// the security headers on every answer.
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range a.routes() {
		h := rt.h
		if strings.HasPrefix(rt.Path, "/v1/") && !rt.stream {
			h = a.deadline(h)
		}
		mux.Handle(rt.Method+" "+rt.Path, a.auth(rt.Route, h))
	}
	return secure(jsonMisses(mux))
}

// secure sets the headers every answer carries. The status page sets its
// own Content-Security-Policy.
func secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}
