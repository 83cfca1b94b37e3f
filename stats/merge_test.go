package stats

import (
	"math"
	"strconv"
	"testing"
)

func fmtMS(p *float64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatFloat(*p, 'f', 1, 64)
}

// Quantiles come from the merged buckets, not from each scanner's: one
// scanner fired 90 events in 10-20ms, another 10 in 1-2s; the fleet's p50
// lies in the first bucket and its p99 in the second.
func TestStatsQuantilesMergeBuckets(t *testing.T) {
	inf := math.Inf(1)
	a := map[float64]uint64{0.01: 0, 0.02: 90, 1: 90, 2: 90, inf: 90}
	b := map[float64]uint64{0.01: 0, 0.02: 0, 1: 0, 2: 10, inf: 10}
	merged := map[float64]uint64{}
	for _, h := range []map[float64]uint64{a, b} {
		for le, c := range h {
			merged[le] += c
		}
	}
	v := quantiles(merged)
	if v.Count != 100 || v.P50 == nil || *v.P50 < 10 || *v.P50 > 20 || v.P99 == nil || *v.P99 < 1000 || *v.P99 > 2000 {
		t.Errorf("merged: %+v (p50 %s, p99 %s), want 100 events, p50 in 10-20ms, p99 in 1-2s", v, fmtMS(v.P50), fmtMS(v.P99))
	}
	if v := quantiles(map[float64]uint64{0.01: 0, inf: 0}); v.P50 != nil || v.P99 != nil || v.Count != 0 {
		t.Errorf("no events: %+v, want no quantiles", v)
	}
	// Above the last finite bound all that is known is that bound.
	if v := quantiles(map[float64]uint64{60: 0, inf: 4}); v.P99 == nil || *v.P99 != 60000 {
		t.Errorf("beyond the last bucket: p99 %s, want 60000", fmtMS(v.P99))
	}
}
