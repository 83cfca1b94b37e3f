package check

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// The rules are evaluated on an in-memory store of the series a story
// loads, in promqltest's "load" notation, rather than on Prometheus's TSDB:
// the TSDB would pull every remote-storage and cloud SDK Prometheus links
// into this module's build.

// point is one float sample.
type point struct {
	t int64
	f float64
}

func (p point) T() int64                      { return p.t }
func (p point) ST() int64                     { return 0 }
func (p point) F() float64                    { return p.f }
func (p point) H() *histogram.Histogram       { return nil }
func (p point) FH() *histogram.FloatHistogram { return nil }
func (p point) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (p point) Copy() chunks.Sample           { return p }

// memStore holds series loaded from lines of "<series> <values>", one
// value per step from time 0.
type memStore struct{ series []storage.Series }

func loadSeries(p parser.Parser, lines string, step time.Duration) (*memStore, error) {
	m := &memStore{}
	for _, line := range strings.Split(lines, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		lbls, vals, err := p.ParseSeriesDesc(line)
		if err != nil {
			return nil, fmt.Errorf("series %q: %w", line, err)
		}
		var pts []chunks.Sample
		for i, v := range vals {
			if v.Omitted {
				continue
			}
			if v.Histogram != nil {
				return nil, fmt.Errorf("series %q: native histograms are not supported here", line)
			}
			pts = append(pts, point{t: int64(i) * step.Milliseconds(), f: v.Value})
		}
		m.series = append(m.series, storage.NewListSeries(lbls, pts))
	}
	return m, nil
}

func (m *memStore) queryable() storage.Queryable {
	return &storage.MockQueryable{MockQuerier: &storage.MockQuerier{
		SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
			var out []storage.Series
			for _, s := range m.series {
				if matchAll(s.Labels(), ms) {
					out = append(out, s)
				}
			}
			return &seriesSet{series: out, i: -1}
		},
	}}
}

func matchAll(l labels.Labels, ms []*labels.Matcher) bool {
	for _, m := range ms {
		if !m.Matches(l.Get(m.Name)) {
			return false
		}
	}
	return true
}

type seriesSet struct {
	series []storage.Series
	i      int
}

func (s *seriesSet) Next() bool                        { s.i++; return s.i < len(s.series) }
func (s *seriesSet) At() storage.Series                { return s.series[s.i] }
func (s *seriesSet) Err() error                        { return nil }
func (s *seriesSet) Warnings() annotations.Annotations { return nil }
