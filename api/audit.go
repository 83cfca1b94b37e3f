package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// AuditRecord is one state-changing API call as the audit trail keeps it
// (sigwatch.audit, GET /v1/audit).
type AuditRecord = dispatch.AuditRecord

// AuditList is the body of GET /v1/audit.
type AuditList struct {
	Records []AuditRecord `json:"records"`
}

const (
	// auditKept is how many records Redis keeps, the most recent.
	auditKept = 10000
	// maxAudit bounds the limit of GET /v1/audit.
	maxAudit = 1000
	// auditWait bounds what recording a call adds to it while Redis or
	// NATS does not answer: well within natsGrace, so that a NATS outage
	// never turns a call that succeeded into a 503.
	auditWait = 300 * time.Millisecond
	// auditLeaf is the capped LIST of recent records, newest first.
	auditLeaf = "audit"
)

// auditMetrics count the records and the publishes that failed.
type auditMetrics struct {
	records  *prometheus.CounterVec
	failures prometheus.Counter
}

func newAuditMetrics(reg prometheus.Registerer) auditMetrics {
	m := auditMetrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sigwatch", Name: "audit_records_total",
			Help: "State-changing API calls recorded in the audit trail, by action and outcome (ok, refused: 4xx, failed: 5xx)."},
			[]string{"action", "outcome"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sigwatch", Name: "audit_publish_failures_total",
			Help: "Audit records not published on sigwatch.audit (NATS down or slow); they are still logged."}),
	}
	if reg != nil {
		m.records = register(reg, m.records)
		m.failures = register(reg, m.failures)
	}
	return m
}

// auditNote is where a handler that learns its target only from the body
// (a mute's id, a batch's size) leaves it for the record.
type auditNote struct{ target string }

type auditNoteKey struct{}

// noteTarget sets the target of the call r's record to target.
func noteTarget(r *http.Request, target string) {
	if n, ok := r.Context().Value(auditNoteKey{}).(*auditNote); ok {
		n.target = target
	}
}

// pathTarget is the target of a call named by its path values, joined by
// "/".
func pathTarget(names ...string) func(*http.Request) string {
	return func(r *http.Request) string {
		parts := make([]string, len(names))
		for j, n := range names {
			parts[j] = r.PathValue(n)
		}
		return strings.Join(parts, "/")
	}
}

// audited serves h and records the call in the audit trail as action on
// the target target gives (nil: none, or what h notes): one log line, one
// message on sigwatch.audit and one entry of GET /v1/audit, with the
// caller's name and how the call ended.
func (a *API) audited(action string, target func(*http.Request) string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		note := &auditNote{}
		if target != nil {
			note.target = target(r)
		}
		aw := &auditWriter{ResponseWriter: w}
		h(aw, r.WithContext(context.WithValue(r.Context(), auditNoteKey{}, note)))
		a.audit(r.Context(), action, note.target, aw.status(), aw.outcome())
	}
}

// audit records one call: logged at once, before the answer goes, so that
// it is kept whatever Redis and NATS do; then queued to be kept in Redis
// and published, in order, without holding the answer (see auditQueue).
func (a *API) audit(ctx context.Context, action, target string, status int, outcome string) {
	c := callerOf(ctx)
	rec := AuditRecord{ID: auditID(), At: a.o.Now().UnixMilli(), Who: c.Name, Role: c.Role.String(),
		Action: action, Target: target, Outcome: outcome, Status: status}
	a.o.Log.Info("audit", "who", rec.Who, "role", rec.Role, "action", rec.Action, "target", rec.Target,
		"outcome", rec.Outcome, "status", rec.Status)
	kind := "ok"
	switch {
	case status >= 500:
		kind = "failed"
	case status >= 400:
		kind = "refused"
	}
	a.auditM.records.WithLabelValues(action, kind).Inc()
	if !a.auditQ.push(rec) {
		a.auditM.failures.Inc()
		a.o.Log.Warn("audit records queue full: a record is only in the log", "action", action)
	}
}

// storeAudits keeps recs, oldest first, at the head of the capped list in
// one round trip and publishes them in one batch, each waited for at most
// auditWait.
func (a *API) storeAudits(recs []AuditRecord) {
	ctx, cancel := context.WithTimeout(context.Background(), auditWait)
	defer cancel()
	var wg sync.WaitGroup
	if a.o.Store != nil {
		wg.Go(func() { a.keepAudits(ctx, recs) })
	}
	if _, down := a.o.Deps.Down("nats"); down || a.o.Pub == nil {
		a.auditM.failures.Add(float64(len(recs)))
	} else {
		failed := 0
		var last error
		for _, err := range a.o.Pub.Audits(ctx, recs) {
			if err != nil {
				failed++
				last = err
			}
		}
		if failed > 0 {
			a.auditM.failures.Add(float64(failed))
			a.o.Log.Warn("audit records not published", "records", failed, "err", last)
		}
	}
	wg.Wait()
}

// keepAudits puts recs at the head of the capped list, newest first.
func (a *API) keepAudits(ctx context.Context, recs []AuditRecord) {
	key := a.o.Store.Keys().Meta(auditLeaf)
	vals := make([]string, len(recs))
	for j, rec := range recs {
		b, _ := json.Marshal(rec)
		vals[j] = string(b)
	}
	rs := a.o.Store.DoMulti(ctx, shard.Cmd{Name: "LPUSH", Keys: []string{key}, Args: vals},
		shard.Cmd{Name: "LTRIM", Keys: []string{key}, Args: []string{"0", strconv.Itoa(auditKept - 1)}})
	if err := rs[0].Error(); err != nil {
		a.o.Log.Warn("audit records not kept in redis", "records", len(recs), "err", err)
	}
}

// getAudit is GET /v1/audit?limit=N: the most recent records, newest
// first, of every replica.
func (a *API) getAudit(w http.ResponseWriter, r *http.Request) {
	n, err := limit(r, maxAudit)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	rows, err := a.o.Store.Do(r.Context(), "LRANGE", []string{a.o.Store.Keys().Meta(auditLeaf)}, "0", strconv.Itoa(n-1)).AsStrSlice()
	if err != nil {
		writeErr(w, err)
		return
	}
	out := AuditList{Records: make([]AuditRecord, 0, len(rows))}
	for _, row := range rows {
		var rec AuditRecord
		if json.Unmarshal([]byte(row), &rec) == nil {
			out.Records = append(out.Records, rec)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// auditID is a record's id (and Nats-Msg-Id): random, as two calls may
// be alike in every other field.
func auditID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "audit/" + hex.EncodeToString(b[:])
}

// maxRefusal bounds what of a refusal's body is kept for its words.
const maxRefusal = 4096

// auditWriter notes the status of an answer and the words of a refusal.
type auditWriter struct {
	http.ResponseWriter
	code int
	body bytes.Buffer
}

func (aw *auditWriter) WriteHeader(code int) {
	if aw.code == 0 {
		aw.code = code
	}
	aw.ResponseWriter.WriteHeader(code)
}

func (aw *auditWriter) Write(p []byte) (int, error) {
	if aw.code == 0 {
		aw.code = http.StatusOK
	}
	if aw.code >= 400 && aw.body.Len() < maxRefusal {
		aw.body.Write(p[:min(len(p), maxRefusal-aw.body.Len())])
	}
	return aw.ResponseWriter.Write(p)
}

func (aw *auditWriter) status() int { return max(aw.code, http.StatusOK) }

// outcome is "ok", or the refusal's error in plain words.
func (aw *auditWriter) outcome() string {
	code := aw.status()
	if code < 400 {
		return "ok"
	}
	var body struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(aw.body.Bytes(), &body) == nil && body.Error != "" {
		return body.Error
	}
	return strings.ToLower(http.StatusText(code))
}
