package check

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
)

const alertsFile = "../prometheus/alerts.yml"

// ruleCase is one story told in series: whether rule fires at its end.
type ruleCase struct {
	name   string
	rule   string
	series string // promqltest load lines, one sample a minute from 0
	at     time.Duration
	fires  bool
}

// base is a series every story has, so that no storage is empty.
const base = "  up{job=\"prometheus\"} 1x60\n"

// up are the series of a healthy single sigwatch with every role, MQTT
// included, for minutes 0 to 60.
const up = base + `  sigwatch_clock_offset_seconds{instance="a"} 0x60
  sigwatch_ingest_watermark_age_seconds{instance="a"} 0.5x60
  sigwatch_ingest_connected{instance="a"} 1x60
  sigwatch_nats_connected{instance="a"} 1x60
  sigwatch_scanner_owned_shards{instance="a", family="deadlines"} 16x60
  sigwatch_scanner_owned_shards{instance="a", family="repeats"} 16x60
  sigwatch_redis_restoring{instance="a"} 0x60
`

// httpOnly is up without MQTT: no sigwatch_ingest_connected at all.
const httpOnly = base + `  sigwatch_clock_offset_seconds{instance="a"} 0x60
  sigwatch_ingest_watermark_age_seconds{instance="a"} 0.5x60
  sigwatch_nats_connected{instance="a"} 1x60
  sigwatch_scanner_owned_shards{instance="a", family="deadlines"} 16x60
`

var cases = []ruleCase{
	{name: "a healthy fleet", rule: "*", series: up, at: 60 * time.Minute},
	{name: "an HTTP-only healthy fleet", rule: "*", series: httpOnly, at: 60 * time.Minute},

	{name: "no process scraped", rule: "SigwatchDown", series: base, at: 5 * time.Minute, fires: true},
	{name: "no ingest role", rule: "SigwatchNoIngestProcess", series: base + `  sigwatch_clock_offset_seconds{instance="a"} 0x60
`, at: 5 * time.Minute, fires: true},

	// The fault fixed: an HTTP-only fleet has no connected series and never
	// fires; a fleet with MQTT fires when it is disconnected or gone.
	{name: "HTTP-only fleet", rule: "SigwatchNoIngest", series: httpOnly, at: 60 * time.Minute},
	{name: "MQTT disconnected", rule: "SigwatchNoIngest", series: base + `  sigwatch_ingest_connected{instance="a"} 1x5 0x30
`, at: 10 * time.Minute, fires: true},
	{name: "MQTT disconnected, briefly", rule: "SigwatchNoIngest", series: base + `  sigwatch_ingest_connected{instance="a"} 1x5 0 1x30
`, at: 10 * time.Minute},
	{name: "one of two connected", rule: "SigwatchNoIngest", series: base + `  sigwatch_ingest_connected{instance="a"} 0x30
  sigwatch_ingest_connected{instance="b"} 1x30
`, at: 20 * time.Minute},
	{name: "MQTT processes gone", rule: "SigwatchNoIngest", series: base + `  sigwatch_ingest_connected{instance="a"} 1x5 stale
`, at: 15 * time.Minute, fires: true},

	{name: "watermark old", rule: "SigwatchIngestStalled", series: base + `  sigwatch_ingest_watermark_age_seconds{instance="a"} 0.5x5 60+60x20
`, at: 10 * time.Minute, fires: true},

	{name: "fire lag p99 under 1s", rule: "SigwatchFireLagHigh", series: base + fireLag(100, 0), at: 30 * time.Minute},
	{name: "fire lag p99 over 1s", rule: "SigwatchFireLagHigh", series: base + fireLag(90, 10), at: 30 * time.Minute, fires: true},

	{name: "lost events not published", rule: "SigwatchPublishErrors", series: base + `  sigwatch_scanner_publish_errors_total{instance="a", family="deadlines"} 0+3x30
`, at: 15 * time.Minute, fires: true},
	{name: "alarm notifications not published", rule: "SigwatchAlarmPublishErrors", series: base + `  sigwatch_alarm_publish_errors_total{instance="a"} 0+3x30
`, at: 15 * time.Minute, fires: true},
	{name: "NATS disconnected", rule: "SigwatchNATSDisconnected", series: base + `  sigwatch_nats_connected{instance="a"} 1x5 0x30
`, at: 10 * time.Minute, fires: true},

	{name: "no shard owned", rule: "SigwatchNoScanner", series: base + `  sigwatch_scanner_owned_shards{instance="a", family="deadlines"} 0x30
`, at: 5 * time.Minute, fires: true},
	{name: "only repeat shards owned", rule: "SigwatchNoScanner", series: base + `  sigwatch_scanner_owned_shards{instance="a", family="repeats"} 16x30
`, at: 5 * time.Minute, fires: true},

	// The fault fixed: a sigwatch restart with old drops. The broker had
	// dropped 500 before; the old rule on the old gauge (-1 until the
	// broker reports, then its whole count) fired; the counter stays 0.
	{name: "restart with old drops, old rule", rule: "old SigwatchBrokerDropping", series: base + `  sigwatch_ingest_broker_dropped_messages{instance="a"} 500x10 _ -1 500x20
`, at: 14 * time.Minute, fires: true},
	{name: "restart with old drops", rule: "SigwatchBrokerDropping", series: base + `  sigwatch_ingest_broker_dropped_total{instance="a"} 0x10 _ 0x20
`, at: 14 * time.Minute},
	{name: "restart after new drops", rule: "SigwatchBrokerDropping", series: base + `  sigwatch_ingest_broker_dropped_total{instance="a"} 0x5 7x5 _ 0x20
`, at: 25 * time.Minute},
	{name: "new drops", rule: "SigwatchBrokerDropping", series: base + `  sigwatch_ingest_broker_dropped_total{instance="a"} 0x10 4 4x20
`, at: 12 * time.Minute, fires: true},

	{name: "Redis writes failing", rule: "SigwatchRedisErrors", series: base + `  sigwatch_ingest_store_errors_total{instance="a"} 0+5x30
`, at: 15 * time.Minute, fires: true},
	{name: "Redis lost data", rule: "SigwatchRedisDataLoss", series: base + `  sigwatch_redis_data_loss_total{instance="a"} 0x5 1x30
`, at: 8 * time.Minute, fires: true},
	{name: "Redis lost data long ago", rule: "SigwatchRedisDataLoss", series: base + `  sigwatch_redis_data_loss_total{instance="a"} 0x5 1x50
`, at: 40 * time.Minute},
	{name: "restoring for 10 minutes", rule: "SigwatchRedisRestoring", series: base + `  sigwatch_redis_restoring{instance="a"} 0x5 1x30
`, at: 15 * time.Minute, fires: true},
	{name: "restored within a minute", rule: "SigwatchRedisRestoring", series: base + `  sigwatch_redis_restoring{instance="a"} 0x5 1 0x30
`, at: 15 * time.Minute},

	{name: "invalid input, 2/s", rule: "SigwatchInvalidInput", series: base + `  sigwatch_ingest_invalid_total{instance="a", reason="topic"} 0+120x30
`, at: 25 * time.Minute, fires: true},
}

// oldRules are the rules as they were before the faults were fixed, to show
// the stories above catch them.
var oldRules = map[string]rulefmt.Rule{
	"old SigwatchBrokerDropping": {Alert: "SigwatchBrokerDropping", Expr: "increase(sigwatch_ingest_broker_dropped_messages[10m]) > 0"},
	"old SigwatchNoIngest":       {Alert: "SigwatchNoIngest", Expr: "absent(sigwatch_ingest_connected == 1)", For: model.Duration(2 * time.Minute)},
}

// fireLag is the fire-lag histogram of 100 lost events a minute, fast of
// them under 0.5s and slow between 1s and 2s.
func fireLag(fast, slow int) string {
	var s string
	for _, b := range []struct {
		le string
		n  int
	}{{"0.5", fast}, {"1", fast}, {"2", fast + slow}, {"+Inf", fast + slow}} {
		s += fmt.Sprintf("  sigwatch_scanner_fire_lag_seconds_bucket{instance=\"a\", family=\"deadlines\", le=%q} 0+%dx40\n", b.le, b.n)
	}
	return s
}

// TestAlertRules evaluates every rule of alerts.yml, as Prometheus does
// once a minute, on the stories above: each rule fires on the condition it
// names and stays quiet on a healthy fleet, with or without MQTT.
func TestAlertRules(t *testing.T) {
	p := parser.NewParser(parser.Options{})
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, p, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, err := range errs {
		t.Fatal(err)
	}
	byName := map[string]rulefmt.Rule{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if _, dup := byName[r.Alert]; dup {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			byName[r.Alert] = r
		}
	}
	fired := map[string]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			names := []string{c.rule}
			if c.rule == "*" {
				names = names[:0]
				for n := range byName {
					names = append(names, n)
				}
			}
			for _, n := range names {
				r, ok := byName[n]
				if !ok {
					if r, ok = oldRules[n]; !ok {
						t.Fatalf("no rule %s in %s", n, alertsFile)
					}
				}
				got := firing(t, p, r, c.series, c.at)
				if got != c.fires {
					t.Errorf("%s at %v: firing %v, want %v\nexpr: %s\nseries:\n%s", n, c.at, got, c.fires, r.Expr, c.series)
				}
				if got {
					fired[n] = true
				}
			}
		})
	}
	for n := range byName {
		if !fired[n] {
			t.Errorf("alert %s is never shown firing: add a case for the condition it names", n)
		}
	}
}

// TestOldNoIngestFiresOnHTTPOnlyFleets shows the fault the new SigwatchNoIngest
// fixes: the old rule fires forever on a fleet without MQTT.
func TestOldNoIngestFiresOnHTTPOnlyFleets(t *testing.T) {
	p := parser.NewParser(parser.Options{})
	if !firing(t, p, oldRules["old SigwatchNoIngest"], httpOnly, 60*time.Minute) {
		t.Errorf("the old SigwatchNoIngest does not fire on an HTTP-only fleet; the story does not show the fault")
	}
}

// firing evaluates r every minute from 0 to at on series, as Prometheus's
// rule manager does, and reports whether it fires at the end: the
// expression has held a result at every evaluation for at least r.For.
func firing(t *testing.T, p parser.Parser, r rulefmt.Rule, series string, at time.Duration) bool {
	t.Helper()
	store, err := loadSeries(p, series, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	if _, err := p.ParseExpr(r.Expr); err != nil {
		t.Fatalf("%s: %v", r.Alert, err)
	}
	start := time.Unix(0, 0).UTC()
	var since time.Time // start of the current run of evaluations with a result
	for ts := start; !ts.After(start.Add(at)); ts = ts.Add(time.Minute) {
		q, err := engine.NewInstantQuery(context.Background(), store.queryable(), nil, r.Expr, ts)
		if err != nil {
			t.Fatalf("%s: %v", r.Alert, err)
		}
		res := q.Exec(context.Background())
		if res.Err != nil {
			t.Fatalf("%s at %v: %v", r.Alert, ts.Sub(start), res.Err)
		}
		v, err := res.Vector()
		q.Close()
		if err != nil {
			t.Fatalf("%s at %v: %v", r.Alert, ts.Sub(start), err)
		}
		switch {
		case len(v) == 0:
			since = time.Time{}
		case since.IsZero():
			since = ts
		}
	}
	return !since.IsZero() && start.Add(at).Sub(since) >= time.Duration(r.For)
}
