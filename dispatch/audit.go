package dispatch

import "context"

// Audit is the subject of the audit trail: one record per state-changing
// API call.
func (s Subjects) Audit() string { return s.prefix() + ".audit" }

// AuditRecord is the body of a message on Audit: who made a call (the
// token's name, never the token) with which role, what it did to what,
// when (unix ms), and how it ended ("ok" or the refusal in plain words,
// with the HTTP status).
type AuditRecord struct {
	ID      string `json:"id"`
	At      int64  `json:"at"`
	Who     string `json:"who"`
	Role    string `json:"role"`
	Action  string `json:"action"`
	Target  string `json:"target,omitempty"`
	Outcome string `json:"outcome"`
	Status  int    `json:"status"`
}

func (ev AuditRecord) subject(s Subjects) string { return s.Audit() }
func (ev AuditRecord) msgID() string             { return ev.ID }

// Audits publishes recs, in order, on the audit subject, into the event
// stream in JetStream mode, within ctx: a NATS outage must not hold the
// API. It returns one error per record (nil: taken).
func (p *Bus) Audits(ctx context.Context, recs []AuditRecord) []error {
	msgs := make([]Message, len(recs))
	for j, rec := range recs {
		m, err := Encode(p.subjects, rec)
		if err != nil {
			errs := make([]error, len(recs))
			for k := range errs {
				errs[k] = err
			}
			return errs
		}
		msgs[j] = m
	}
	return p.Publish(ctx, msgs)
}
