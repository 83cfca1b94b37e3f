package ingest

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestBreaksJudgeRestarts proves how a lost broker connection becomes an
// outage (invariant 6): always through the reconnection, and through the
// reconnect grace after it unless the broker shows it kept running — the
// same broker, started before the connection was lost.
func TestBreaksJudgeRestarts(t *testing.T) {
	const grace = 5 * time.Second
	const broker = "tcp://127.0.0.1:1883"
	type step func(b *breaks)
	lost := func(at int64) step {
		return func(b *breaks) { b.noticed(at); b.lose(at + 5) }
	}
	attempt := func(url string) step { return func(b *breaks) { b.attempt(url) } }
	back := func(at int64) step { return func(b *breaks) { b.connected(at) } }
	uptime := func(at, s int64) step { return func(b *breaks) { b.uptime(at, s) } }
	for _, c := range []struct {
		name            string
		steps           []step
		report          int64
		end, graceFrom  int64
		outages, graces float64
	}{
		{"own connection: uptime from before the loss",
			[]step{attempt(broker), back(1_000), uptime(1_100, 3600), lost(10_000), attempt(broker), back(12_000), uptime(12_010, 3611)},
			12_050, 12_050, 0, 1, 0},
		{"broker restarted: uptime from after the loss",
			[]step{attempt(broker), back(1_000), lost(10_000), attempt(broker), uptime(12_000, 1), back(12_005)},
			12_050, 12_005 + grace.Milliseconds(), 12_005, 1, 1},
		{"broker silent about its uptime",
			[]step{attempt(broker), back(1_000), lost(10_000), attempt(broker), back(12_000)},
			12_050, 12_000 + grace.Milliseconds(), 12_000, 1, 1},
		{"another broker",
			[]step{attempt(broker), back(1_000), lost(10_000), attempt("tcp://127.0.0.1:1884"), back(12_000), uptime(12_010, 3600)},
			12_050, 12_000 + grace.Milliseconds(), 12_000, 1, 1},
		{"a report from before the loss",
			[]step{attempt(broker), back(1_000), lost(10_000)},
			9_990, 0, 0, 0, 0},
		{"a report while down reaches the report",
			[]step{attempt(broker), back(1_000), lost(10_000)},
			10_500, 10_500, 0, 0, 0},
		{"no break",
			[]step{attempt(broker), back(1_000), uptime(1_010, 5)},
			2_000, 0, 0, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMetrics(&Ingest{})
			b := &breaks{grace: grace, m: m}
			for _, s := range c.steps {
				s(b)
			}
			end, from, gen := b.report(c.report)
			if end != c.end || from != c.graceFrom {
				t.Errorf("report at %d: got outage through %d, grace from %d; want %d, %d", c.report, end, from, c.end, c.graceFrom)
			}
			if got := testutil.ToFloat64(m.brokerOutages); got != c.outages {
				t.Errorf("broker outages counted %v, want %v", got, c.outages)
			}
			if got := testutil.ToFloat64(m.reconnectGraces); got != c.graces {
				t.Errorf("reconnect graces counted %v, want %v", got, c.graces)
			}
			b.reported(gen)
			if end, _, _ := b.report(c.report + 10_000); end != 0 && !b.down {
				t.Errorf("after the report was stored: got outage through %d, want none", end)
			}
		})
	}
}

// TestBreaksKeepUntilStored proves that an outage is asked for until a
// report that saw all of it is stored: a break that happens between a
// report and its store stays.
func TestBreaksKeepUntilStored(t *testing.T) {
	b := &breaks{grace: time.Second, m: newMetrics(&Ingest{})}
	b.attempt("x")
	b.connected(1_000)
	b.lose(5_000)
	b.connected(6_000)
	b.uptime(6_001, 3600)
	end, _, gen := b.report(6_100)
	b.lose(7_000) // before the report is stored
	b.reported(gen)
	b.connected(8_000)
	b.uptime(8_001, 3600)
	if end2, _, _ := b.report(8_100); end != 6_100 || end2 != 8_100 || b.since != 5_000 {
		t.Errorf("got outages through %d then %d from %d, want 6100 then 8100 from 5000", end, end2, b.since)
	}
}
