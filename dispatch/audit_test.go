package dispatch

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestStreamGainsTheAuditSubject shows that an event stream from before the
// audit trail (and the sinks' dead letters) gains their subjects at start,
// keeping its events, and that an audit record is stored in it once, by its
// id.
func TestStreamGainsTheAuditSubject(t *testing.T) {
	ctx := context.Background()
	nc, js := natsConn(t)
	old := Subjects{Prefix: "sigwatch"}.Stream()
	old = slices.DeleteFunc(slices.Clone(old), func(s string) bool { return s == "sigwatch.audit" || s == "sigwatch.sink.>" })
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SIGWATCH", Subjects: old,
		Duplicates: 2 * time.Minute, MaxAge: DefaultMaxAge}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "sigwatch.lost.meter", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, nc, Options{AckWait: time.Second})
	rec := AuditRecord{ID: "audit/1", At: 1, Who: "ops", Role: "operator", Action: "device.ack", Target: "d", Outcome: "ok", Status: 200}
	for range 2 {
		if err := p.Audits(ctx, []AuditRecord{rec})[0]; err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(ctx, "SIGWATCH")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.Subjects; !slices.Contains(got, "sigwatch.audit") || !slices.Contains(got, "sigwatch.sink.>") {
		t.Fatalf("event stream subjects %v, want sigwatch.audit and sigwatch.sink.> added", got)
	}
	m, err := s.GetLastMsgForSubject(ctx, "sigwatch.audit")
	if err != nil || string(m.Header.Get("Nats-Msg-Id")) != rec.ID {
		t.Fatalf("last audit message: %v %v, want the record by its id", m, err)
	}
	if n := s.CachedInfo().State.Msgs; n != 2 {
		t.Errorf("%d messages stored, want the old event and the record once", n)
	}
}
