package api

import (
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/guard"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/liveness"
	"github.com/sigwatch/sigwatch/internal/statuspage"
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
	if !isLoopback(host) && c.Token == "" {
		return fmt.Errorf("http.addr %s is not loopback: set http.token (SIGWATCH_HTTP_TOKEN) so the API is not open to the network", c.Addr)
	}
	return nil
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
	Gatherer prometheus.Gatherer
	Stalled  func() []string

	// Registerer takes the API's own metrics (the audit trail's); nil: none.
	Registerer prometheus.Registerer
	// Deps says whether Redis or NATS is down (nil: never), for the
	// deadline of every /v1 request and /readyz.
	Deps *liveness.Deps
	Now  func() time.Time
	Log  *slog.Logger
}

// API is the admin API of one process.
type API struct {
	o      Options
	auditM auditMetrics
}

// New returns the API serving o.
func New(o Options) *API { return &API{o: o, auditM: newAuditMetrics(o.Registerer)} }

// Handler is every route. /metrics, /healthz and /readyz are open (they
// carry no device data); /v1 needs the bearer token when one is set.
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.o.Gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /{$}", statuspage.Handler()) // the status page: no data, its script calls /v1 with the token
	mux.Handle("GET /ui/", statuspage.Handler())

	v1 := http.NewServeMux()
	v1.HandleFunc("GET /v1/devices", a.getDevices)
	v1.HandleFunc("GET /v1/alarms", a.withAlarms(a.getAlarms))
	v1.HandleFunc("GET /v1/devices/{id}", a.getDevice)
	v1.HandleFunc("DELETE /v1/devices/{id}", a.audited("device.remove", pathTarget("id"), a.deleteDevice))
	v1.HandleFunc("PUT /v1/devices/{id}/threshold", a.audited("device.threshold", pathTarget("id"), a.putThreshold))
	v1.HandleFunc("PUT /v1/devices/{id}/group", a.audited("device.group", pathTarget("id"), a.putGroup))
	v1.HandleFunc("POST /v1/devices/{id}/ack", a.audited("device.ack", pathTarget("id"), a.postAck))
	v1.HandleFunc("GET /v1/types", a.getTypes)
	v1.HandleFunc("GET /v1/types/{type}", a.getType)
	v1.HandleFunc("PUT /v1/types/{type}", a.audited("type.set", pathTarget("type"), a.putType))
	v1.HandleFunc("DELETE /v1/types/{type}", a.audited("type.delete", pathTarget("type"), a.deleteType))
	v1.HandleFunc("GET /v1/mutes", a.withAlarms(a.getMutes))
	v1.HandleFunc("POST /v1/mutes", a.audited("mute.create", nil, a.withAlarms(a.postMute)))
	v1.HandleFunc("DELETE /v1/mutes/{id}", a.audited("mute.delete", pathTarget("id"), a.withAlarms(a.deleteMute)))
	v1.HandleFunc("POST /v1/signals", a.audited("signals.post", nil, a.postSignals))
	v1.HandleFunc("GET /v1/shards", a.getShards)
	v1.HandleFunc("POST /v1/shards/double", a.audited("shards.double", nil, a.postShardsDouble))
	v1.HandleFunc("GET /v1/stats", a.getStats)
	v1.HandleFunc("GET /v1/storms", a.withAlarms(a.getStorms))
	v1.HandleFunc("POST /v1/groups/{group}/ack", a.audited("group.ack", pathTarget("group"), a.withAlarms(a.postGroupAck)))
	v1.HandleFunc("POST /v1/fleet/ack", a.audited("fleet.ack", nil, a.withAlarms(a.postFleetAck)))
	v1.HandleFunc("GET /v1/sinks", a.getSinks)
	v1.HandleFunc("GET /v1/audit", a.getAudit)
	v1.HandleFunc("POST /v1/sinks/{name}/test", a.audited("sink.test", pathTarget("name"), a.postSinkTest))
	if a.o.Timers != nil {
		v1.HandleFunc("PUT /v1/timers/{queue}/{id...}", a.audited("timer.arm", pathTarget("queue", "id"), a.putTimer))
		v1.HandleFunc("GET /v1/timers/{queue}/{id...}", a.getTimer)
		v1.HandleFunc("DELETE /v1/timers/{queue}/{id...}", a.audited("timer.cancel", pathTarget("queue", "id"), a.deleteTimer))
		v1.HandleFunc("POST /v1/timers/{queue}", a.audited("timer.batch", pathTarget("queue"), a.postTimers))
	} else {
		v1.HandleFunc("/v1/timers/", func(w http.ResponseWriter, _ *http.Request) {
			writeError(w, http.StatusServiceUnavailable, "timers are off here (timers.enabled: false)")
		})
	}
	// The event stream lasts as long as its reader and needs NATS alone:
	// it is served without the deadline.
	mux.Handle("GET /v1/events", a.auth(http.HandlerFunc(a.getEvents)))
	mux.Handle("/v1/", a.auth(a.deadline(jsonMisses(v1))))
	return jsonMisses(mux)
}

func (a *API) auth(next http.Handler) http.Handler {
	if a.o.Token == "" {
		return next
	}
	want := []byte("Bearer " + a.o.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}
