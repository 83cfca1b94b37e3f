package testenv

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The value of one counter or gauge a test holds is testutil.ToFloat64(c), and the number of
// series in a registry testutil.GatherAndCount(reg, name), from
// github.com/prometheus/client_golang/prometheus/testutil. The readers below cover what testutil
// does not: a histogram's observations, a metric read by name from a registry, and one read from
// a process's /metrics page.

// Observations returns how many observations the histogram or summary c holds. c must collect
// exactly one metric.
func Observations(t testing.TB, c prometheus.Collector) uint64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 16)
	go func() { c.Collect(ch); close(ch) }()
	var ms []prometheus.Metric
	for m := range ch {
		ms = append(ms, m)
	}
	if len(ms) != 1 {
		t.Fatalf("testenv: collected %d metrics, want 1", len(ms))
	}
	var m dto.Metric
	if err := ms[0].Write(&m); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	switch {
	case m.Histogram != nil:
		return m.Histogram.GetSampleCount()
	case m.Summary != nil:
		return m.Summary.GetSampleCount()
	}
	t.Fatalf("testenv: %s is neither a histogram nor a summary", ms[0].Desc())
	return 0
}

// Gathered returns the value of the metric name in g: a counter's or gauge's value, or a
// histogram's or summary's number of observations. labels are name, value pairs that pick one
// series; without them the metric must have exactly one. A metric g does not have fails the
// test.
func Gathered(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("testenv: gather: %v", err)
	}
	v, err := valueOf(mfs, name, labels)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return v
}

// Scraped is Gathered from the Prometheus text exposition at url (a process's /metrics).
func Scraped(t testing.TB, url, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("testenv: scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("testenv: scrape %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	byName, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("testenv: scrape %s: %v", url, err)
	}
	var mfs []*dto.MetricFamily
	for _, mf := range byName {
		mfs = append(mfs, mf)
	}
	v, err := valueOf(mfs, name, labels)
	if err != nil {
		t.Fatalf("testenv: scrape %s: %v", url, err)
	}
	return v
}

func valueOf(mfs []*dto.MetricFamily, name string, labels []string) (float64, error) {
	if len(labels)%2 != 0 {
		return 0, fmt.Errorf("labels %q are not name, value pairs", labels)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var found []*dto.Metric
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labels) {
				found = append(found, m)
			}
		}
		if len(found) != 1 {
			return 0, fmt.Errorf("metric %s{%s} has %d series, want 1", name, strings.Join(labels, ","), len(found))
		}
		m := found[0]
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), nil
		case m.Gauge != nil:
			return m.Gauge.GetValue(), nil
		case m.Untyped != nil:
			return m.Untyped.GetValue(), nil
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), nil
		case m.Summary != nil:
			return float64(m.Summary.GetSampleCount()), nil
		}
		return 0, fmt.Errorf("metric %s has no value", name)
	}
	return 0, fmt.Errorf("no metric %s", name)
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i < len(pairs); i += 2 {
		ok := false
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// Series returns the value of each series of the metric name in g by the value of its label, as
// Gathered reads one: for a vector whose series appear as they are first used. A series not
// there yet is absent from the map, which reads as 0; so is a metric g does not have yet.
func Series(t testing.TB, g prometheus.Gatherer, name, label string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("testenv: gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != label {
					continue
				}
				v, err := valueOf([]*dto.MetricFamily{{Name: mf.Name, Type: mf.Type, Metric: []*dto.Metric{m}}}, name, nil)
				if err != nil {
					t.Fatalf("testenv: %v", err)
				}
				out[l.GetValue()] += v
			}
		}
	}
	return out
}
