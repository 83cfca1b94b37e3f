package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

const (
	dashboardPath = "../../deploy/grafana/sigwatch.json"
	alertsPath    = "../../deploy/prometheus/alerts.yml"
)

// TestDashboardAndAlertsQueryRealMetrics runs a sigwatch with every role,
// makes it ingest, lose and alarm, and checks that every metric the Grafana
// dashboard and the alert rules query is one it exports, with the labels
// they use: neither can drift from the code unnoticed.
func TestDashboardAndAlertsQueryRealMetrics(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) {
		c.MQTT.ClientID = "sigwatch-dashboards-test"
		c.Thresholds.Default = time.Second
	})
	const tok = "t0ken"
	testenv.WaitFor(t, 15*time.Second, "readyz", func() bool {
		code, _ := call(t, app, "GET", "/readyz", "", nil)
		return code == http.StatusOK
	})
	// Signals over MQTT and HTTP, and one the ingest refuses, so that the
	// labelled series appear; the silent devices then go lost and alarm.
	dev := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID("dashboards-dev"))
	for _, topic := range []string{"devices/d1/signal", "devices/d2/signal", "devices//signal"} {
		if tok := dev.Publish(topic, 1, false, []byte("{}")); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", topic, tok.Error())
		}
	}
	if code, out := call(t, app, "POST", "/v1/signals", tok, []map[string]any{{"device": "h1", "type": "meter"}}); code != http.StatusOK {
		t.Fatalf("POST /v1/signals: %d %v", code, out)
	}
	url := "http://" + app.HTTPAddr() + "/metrics"
	testenv.WaitFor(t, 20*time.Second, "3 lost events, their alarms, and the shard sizes", func() bool {
		fams := scrapeFamilies(t, url)
		return familySum(fams["sigwatch_scanner_lost_total"]) >= 3 &&
			familySum(fams["sigwatch_alarm_notifications_total"]) >= 3 &&
			len(fams["sigwatch_scanner_shard_size"].GetMetric()) > 0
	})
	fams := familyLabels(scrapeFamilies(t, url))

	dashboard, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("dashboard", func(t *testing.T) {
		qs, err := dashboardQueries(dashboard)
		if err != nil {
			t.Fatal(err)
		}
		if len(qs) < 20 {
			t.Fatalf("found %d queries in %s, want at least 20 (is the file read whole?)", len(qs), dashboardPath)
		}
		for _, p := range checkQueries(qs, fams) {
			t.Error(p)
		}
	})
	t.Run("alerts", func(t *testing.T) {
		qs, err := ruleQueries(alerts)
		if err != nil {
			t.Fatal(err)
		}
		if len(qs) < 10 {
			t.Fatalf("found %d rules in %s, want at least 10", len(qs), alertsPath)
		}
		for _, p := range checkQueries(qs, fams) {
			t.Error(p)
		}
	})
	// A metric or label renamed in the code is caught: here the copies of
	// the files are changed instead.
	t.Run("renamed metric is caught", func(t *testing.T) {
		renamed := bytes.ReplaceAll(dashboard, []byte("sigwatch_ingest_signals_total"), []byte("sigwatch_ingest_signal_total"))
		qs, err := dashboardQueries(renamed)
		if err != nil {
			t.Fatal(err)
		}
		problems := checkQueries(qs, fams)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, "sigwatch_ingest_signal_total") }) {
			t.Errorf("problems with a renamed metric = %q, want one naming sigwatch_ingest_signal_total", problems)
		}
		renamed = bytes.ReplaceAll(alerts, []byte("sigwatch_redis_restoring"), []byte("sigwatch_redis_restore"))
		if qs, err = ruleQueries(renamed); err != nil {
			t.Fatal(err)
		}
		problems = checkQueries(qs, fams)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, "sigwatch_redis_restore ") }) {
			t.Errorf("problems with a renamed metric = %q, want one naming sigwatch_redis_restore", problems)
		}
	})
	t.Run("renamed label is caught", func(t *testing.T) {
		renamed := bytes.ReplaceAll(dashboard, []byte("by (reason)"), []byte("by (cause)"))
		if bytes.Equal(renamed, dashboard) {
			t.Fatal(`the dashboard has no "by (reason)"`)
		}
		qs, err := dashboardQueries(renamed)
		if err != nil {
			t.Fatal(err)
		}
		problems := checkQueries(qs, fams)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, `label "cause"`) }) {
			t.Errorf("problems with a renamed label = %q, want one naming the label cause", problems)
		}
		renamed = bytes.ReplaceAll(alerts, []byte(`family!="repeats"`), []byte(`kind!="repeats"`))
		if qs, err = ruleQueries(renamed); err != nil {
			t.Fatal(err)
		}
		problems = checkQueries(qs, fams)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, `label "kind"`) }) {
			t.Errorf("problems with a renamed matcher = %q, want one naming the label kind", problems)
		}
	})
}

// query is one PromQL expression and where it comes from.
type query struct{ where, expr string }

// dashboardQueries are the expressions of every panel target (rows and
// their collapsed panels included) and of every query variable.
func dashboardQueries(b []byte) ([]query, error) {
	var d struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var out []query
	var walk func(ps []dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			for i, tg := range p.Targets {
				out = append(out, query{fmt.Sprintf("panel %q target %d", p.Title, i), tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := v.Query
		if m, ok := q.(map[string]any); ok {
			q = m["query"]
		}
		if s, ok := q.(string); ok {
			out = append(out, query{fmt.Sprintf("variable %q", v.Name), s})
		}
	}
	return out, nil
}

type dashPanel struct {
	Title   string      `json:"title"`
	Panels  []dashPanel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// ruleQueries are the expressions of every alerting and recording rule.
func ruleQueries(b []byte) ([]query, error) {
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert  string `yaml:"alert"`
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("alert rules: %w", err)
	}
	var out []query
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, query{"rule " + r.Alert + r.Record, r.Expr})
		}
	}
	return out, nil
}

var (
	metricRE = regexp.MustCompile(`\bsigwatch_[A-Za-z0-9_:]*`)
	// matcherRE is one label matcher inside braces.
	matcherRE = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)`)
	// groupingRE is a by/without/on/ignoring/group_left/group_right list.
	groupingRE = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	// label_values(metric, label) in a Grafana variable.
	labelValuesRE = regexp.MustCompile(`label_values\(\s*([^,]+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)`)
	// quotedRE are string literals, whose content is no metric or label.
	quotedRE = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
)

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = map[string]bool{"instance": true, "job": true}

// checkQueries reports every sigwatch_ metric the queries use that fams
// (family name → its label names) does not have, and every label used in a
// matcher or a grouping that none of the query's metrics carries.
func checkQueries(qs []query, fams map[string]map[string]bool) []string {
	var problems []string
	for _, q := range qs {
		expr := q.expr
		// Labels of every metric of this query, to check groupings by.
		labels := map[string]bool{}
		for _, loc := range metricRE.FindAllStringIndex(expr, -1) {
			name := expr[loc[0]:loc[1]]
			famLabels, ok := family(fams, name)
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: metric %s is not exported (%s)", q.where, name, expr))
				continue
			}
			for l := range famLabels {
				labels[l] = true
			}
			rest := expr[loc[1]:]
			if !strings.HasPrefix(rest, "{") {
				continue
			}
			end := strings.Index(rest, "}")
			if end < 0 {
				problems = append(problems, fmt.Sprintf("%s: unclosed matchers after %s", q.where, name))
				continue
			}
			for _, m := range matcherRE.FindAllStringSubmatch(quotedRE.ReplaceAllString(rest[1:end], `""`), -1) {
				if !famLabels[m[1]] && !targetLabels[m[1]] {
					problems = append(problems, fmt.Sprintf("%s: label %q is not on %s (it has %v)", q.where, m[1], name, sortedKeys(famLabels)))
				}
			}
		}
		for _, m := range groupingRE.FindAllStringSubmatch(expr, -1) {
			for l := range strings.SplitSeq(m[2], ",") {
				l = strings.TrimSpace(l)
				if l != "" && !labels[l] && !targetLabels[l] {
					problems = append(problems, fmt.Sprintf("%s: label %q in %s(...) is on none of its metrics (%s)", q.where, l, m[1], expr))
				}
			}
		}
		for _, m := range labelValuesRE.FindAllStringSubmatch(expr, -1) {
			if l := m[2]; !labels[l] && !targetLabels[l] {
				problems = append(problems, fmt.Sprintf("%s: label %q in label_values is not on %s", q.where, l, m[1]))
			}
		}
	}
	return problems
}

// family returns the labels of the family name belongs to: name itself, or
// the histogram or summary name is a _bucket, _sum or _count series of.
func family(fams map[string]map[string]bool, name string) (map[string]bool, bool) {
	if l, ok := fams[name]; ok {
		return l, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		l, ok := fams[base]
		if !ok || !l[histogramMark] {
			return nil, false
		}
		if suffix != "_bucket" {
			l = withoutLabel(l, "le")
		}
		return l, true
	}
	return nil, false
}

// histogramMark marks a family as a histogram or summary in familyLabels.
const histogramMark = "\x00histogram"

// withoutLabel is l without the label drop.
func withoutLabel(l map[string]bool, drop string) map[string]bool {
	out := make(map[string]bool, len(l))
	for k, v := range l {
		if k != drop {
			out[k] = v
		}
	}
	return out
}

// familyLabels maps each family to the label names its series carry
// (histograms: with le; summaries: with quantile).
func familyLabels(mfs map[string]*dto.MetricFamily) map[string]map[string]bool {
	out := make(map[string]map[string]bool, len(mfs))
	for name, mf := range mfs {
		l := map[string]bool{}
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			l[histogramMark], l["le"] = true, true
		case dto.MetricType_SUMMARY:
			l[histogramMark], l["quantile"] = true, true
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = true
			}
		}
		out[name] = l
	}
	return out
}

// scrapeFamilies reads the metric families a process exports at url.
func scrapeFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	return fams
}

// familySum is the sum of a counter or gauge family's series (0 for nil).
func familySum(mf *dto.MetricFamily) float64 {
	var v float64
	for _, m := range mf.GetMetric() {
		v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return v
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		if k != histogramMark {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}
