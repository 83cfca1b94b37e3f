package api

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sigwatch/sigwatch/internal/statuspage"
)

// Route is one route of the API and the least role that may call it.
type Route struct {
	Method string
	Path   string
	Role   Role
}

// route is a Route and what serves it.
type route struct {
	Route
	h http.Handler
	// stream: the route lasts as long as its reader (no deadline).
	stream bool
}

// routes declares every route next to the role it needs and, for a call
// that changes the installation or an alarm, the action the audit trail
// records. Signals and timer resets are the data flowing through, not
// changes to audit: they are counted in metrics instead. The status page
// and its assets carry no data (the page's script calls /v1 with the
// caller's token); /metrics needs a token only with http.metrics_auth:
// token.
func (a *API) routes() []route {
	metricsRole := RoleNone
	if a.o.MetricsAuth == "token" {
		metricsRole = RoleMetrics
	}
	page := statuspage.Handler()
	r := func(method, path string, role Role, h http.HandlerFunc) route {
		return route{Route: Route{method, path, role}, h: h}
	}
	return []route{
		{Route: Route{"GET", "/metrics", metricsRole}, h: promhttp.HandlerFor(a.o.Gatherer, promhttp.HandlerOpts{Timeout: 10 * time.Second})},
		r("GET", "/healthz", RoleNone, a.healthz),
		r("GET", "/readyz", RoleNone, a.readyz),
		{Route: Route{"GET", "/{$}", RoleNone}, h: page},
		{Route: Route{"GET", "/ui/", RoleNone}, h: page},

		r("GET", "/v1/whoami", RoleViewer, a.getWhoami),
		r("GET", "/v1/devices", RoleViewer, a.getDevices),
		r("GET", "/v1/devices/{id}", RoleViewer, a.getDevice),
		r("DELETE", "/v1/devices/{id}", RoleAdmin, a.audited("device.remove", pathTarget("id"), a.deleteDevice)),
		r("PUT", "/v1/devices/{id}/threshold", RoleOperator, a.audited("device.threshold", pathTarget("id"), a.putThreshold)),
		r("PUT", "/v1/devices/{id}/group", RoleOperator, a.audited("device.group", pathTarget("id"), a.putGroup)),
		r("POST", "/v1/devices/{id}/ack", RoleOperator, a.audited("device.ack", pathTarget("id"), a.postAck)),
		r("GET", "/v1/alarms", RoleViewer, a.withAlarms(a.getAlarms)),
		r("GET", "/v1/types", RoleViewer, a.getTypes),
		r("GET", "/v1/types/{type}", RoleViewer, a.getType),
		r("PUT", "/v1/types/{type}", RoleOperator, a.audited("type.set", pathTarget("type"), a.putType)),
		r("DELETE", "/v1/types/{type}", RoleOperator, a.audited("type.delete", pathTarget("type"), a.deleteType)),
		r("GET", "/v1/mutes", RoleViewer, a.withAlarms(a.getMutes)),
		r("POST", "/v1/mutes", RoleOperator, a.audited("mute.create", nil, a.withAlarms(a.postMute))),
		r("DELETE", "/v1/mutes/{id}", RoleOperator, a.audited("mute.delete", pathTarget("id"), a.withAlarms(a.deleteMute))),
		r("POST", "/v1/signals", RoleOperator, a.postSignals),
		r("GET", "/v1/shards", RoleViewer, a.getShards),
		r("POST", "/v1/shards/double", RoleAdmin, a.audited("shards.double", nil, a.postShardsDouble)),
		r("GET", "/v1/stats", RoleViewer, a.getStats),
		r("GET", "/v1/storms", RoleViewer, a.withAlarms(a.getStorms)),
		r("POST", "/v1/groups/{group}/ack", RoleOperator, a.audited("group.ack", pathTarget("group"), a.withAlarms(a.postGroupAck))),
		r("POST", "/v1/fleet/ack", RoleOperator, a.audited("fleet.ack", nil, a.withAlarms(a.postFleetAck))),
		r("GET", "/v1/sinks", RoleViewer, a.getSinks),
		r("GET", "/v1/audit", RoleViewer, a.getAudit),
		r("POST", "/v1/sinks/{name}/test", RoleAdmin, a.audited("sink.test", pathTarget("name"), a.postSinkTest)),
		r("PUT", "/v1/timers/{queue}/{id...}", RoleOperator, a.withTimers(a.putTimer)),
		r("GET", "/v1/timers/{queue}/{id...}", RoleViewer, a.withTimers(a.getTimer)),
		r("DELETE", "/v1/timers/{queue}/{id...}", RoleOperator, a.audited("timer.cancel", pathTarget("queue", "id"), a.withTimers(a.deleteTimer))),
		r("POST", "/v1/timers/{queue}", RoleOperator, a.withTimers(a.postTimers)),
		{Route: Route{"GET", "/v1/events", RoleViewer}, h: http.HandlerFunc(a.getEvents), stream: true},
	}
}

// Routes lists every route of the API with the role it needs, as Handler
// serves them under the http section c.
func Routes(c Config) []Route {
	a := &API{o: Options{Config: c}}
	var out []Route
	for _, rt := range a.routes() {
		out = append(out, rt.Route)
	}
	return out
}

// withTimers answers 503 while the generic timers are off.
func (a *API) withTimers(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.o.Timers == nil {
			writeError(w, http.StatusServiceUnavailable, "timers are off here (timers.enabled: false)")
			return
		}
		h(w, r)
	}
}

// auth lets a request through when it carries a token of rt's role or
// above, with the token's caller in its context. A missing or unknown
// token is 401, answered later and later while its address keeps failing
// (see throttle); a known token of too low a role is 403.
func (a *API) auth(rt Route, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rt.Role == RoleNone || !a.tokens.enabled() {
			next.ServeHTTP(w, r)
			return
		}
		// The scheme's name is case-insensitive (RFC 9110).
		h := r.Header.Get("Authorization")
		ok := len(h) > len("Bearer ") && strings.EqualFold(h[:len("Bearer ")], "Bearer ")
		presented := ""
		if ok {
			presented = h[len("Bearer "):]
		}
		var c Caller
		if ok {
			c, ok = a.tokens.match(presented)
		}
		if !ok {
			a.refuse(w, r, presented == "")
			return
		}
		if c.Role < rt.Role {
			a.m.authFailures.WithLabelValues("role").Inc()
			writeError(w, http.StatusForbidden, fmt.Sprintf("%s %s needs the %s role; token %s has %s", rt.Method, rt.Path, rt.Role, c.Name, c.Role))
			return
		}
		next.ServeHTTP(w, r.WithContext(withCaller(r.Context(), c)))
	})
}

// refuse answers a request without a good token, held by the throttle.
func (a *API) refuse(w http.ResponseWriter, r *http.Request, missing bool) {
	reason := "wrong"
	if missing {
		reason = "missing"
	}
	a.m.authFailures.WithLabelValues(reason).Inc()
	wait, ok := a.throttle.failed(r)
	if !ok {
		a.m.throttled.Inc()
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusTooManyRequests, "too many failed authentications from this address: try again later")
		return
	}
	if wait > 0 {
		a.m.throttled.Inc()
		hold(r.Context(), wait)
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="sigwatch"`)
	writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
}

// getWhoami says who the token is and what it may do: the status page
// hides what the caller may not do.
func (a *API) getWhoami(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r.Context())
	writeJSON(w, http.StatusOK, Whoami{Name: c.Name, Role: c.Role.String()})
}

// Whoami is GET /v1/whoami.
type Whoami struct {
	Name string `json:"name"`
	Role string `json:"role"`
}
