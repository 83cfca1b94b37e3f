package dispatch

import (
	"context"
	"time"
)

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

// Audit publishes rec on the audit subject, into the event stream in
// JetStream mode, and waits at most wait for it to be taken: a NATS
// outage must not hold the call it records.
func (p *Bus) Audit(ctx context.Context, rec AuditRecord, wait time.Duration) error {
	m, err := Encode(p.subjects, rec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return p.Publish(ctx, []Message{m})[0]
}
