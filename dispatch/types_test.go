package dispatch

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestTypesCannotCreateUnboundedSubjects proves that devices cannot make
// the stream's subjects grow without bound through their types: the
// configured types and the first nats.max_types others get a token each,
// every further type goes out under "other" and is counted.
func TestTypesCannotCreateUnboundedSubjects(t *testing.T) {
	nc, _ := natsConn(t)
	reg := prometheus.NewRegistry()
	p := newPublisher(t, nc, Options{Types: []string{"meter"}, MaxTypes: 3, Registerer: reg})
	s := p.Subjects()
	subjects := map[string]bool{}
	for k := range 1000 {
		subjects[s.Lost(fmt.Sprintf("t%d", k))] = true
	}
	for _, typ := range []string{"meter", "", "t1"} {
		subjects[s.Recovered(typ)] = true
	}
	if got, want := s.Lost("meter"), "sigwatch.lost.meter"; got != want {
		t.Errorf("configured type: %s, want %s", got, want)
	}
	if got, want := s.Lost("t999"), "sigwatch.lost.other"; got != want {
		t.Errorf("type beyond the bound: %s, want %s", got, want)
	}
	var lost []string
	for subj := range subjects {
		if strings.HasPrefix(subj, "sigwatch.lost.") {
			lost = append(lost, subj)
		}
	}
	if len(lost) != 4 {
		t.Errorf("1000 types made %d lost subjects %v, want 4 (3 admitted and other)", len(lost), lost)
	}
	if got := testenv.Gathered(t, reg, "sigwatch_dispatch_type_overflow_total"); got != 998 {
		t.Errorf("type_overflow_total = %v, want 998", got)
	}
}

// TestRuntimeTypesHaveTheirOwnSubjects: a type configured at run time
// gets its own subject token like a configured one, however many other
// types took the nats.max_types room first.
func TestRuntimeTypesHaveTheirOwnSubjects(t *testing.T) {
	nc, _ := natsConn(t)
	p := newPublisher(t, nc, Options{MaxTypes: 1})
	p.ConfiguredTypes(func(typ string) bool { return typ == "late.type" })
	s := p.Subjects()
	if got := s.Lost("first"); got != "sigwatch.lost.first" {
		t.Fatalf("first type: %s", got)
	}
	if got := s.Lost("second"); got != "sigwatch.lost.other" {
		t.Errorf("type beyond the bound: %s, want sigwatch.lost.other", got)
	}
	if got, want := s.Lost("late.type"), "sigwatch.lost.late_type"; got != want {
		t.Errorf("run-time type: %s, want %s", got, want)
	}
}
