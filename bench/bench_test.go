package bench

import (
	"math"
	"os"
	"strings"
	"testing"
)

// These tests cover the harness's arithmetic and report rendering only; they
// start no server and take milliseconds. The benchmarks themselves run with
// `make bench`.

func TestDeviceIDIsFixedWidth(t *testing.T) {
	for _, c := range []struct {
		i    int
		want string
	}{{0, "dev-0000000"}, {42, "dev-0000042"}, {1_000_000, "dev-1000000"}} {
		if got := deviceID(c.i); got != c.want {
			t.Errorf("deviceID(%d) = %q, want %q", c.i, got, c.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(i + 1)
	}
	for _, c := range []struct{ p, want float64 }{{50, 50}, {99, 99}, {100, 100}, {0, 1}} {
		if got := percentile(xs, c.p); got != c.want {
			t.Errorf("percentile(1..100, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("percentile(nil) = %v, want NaN", got)
	}
}

func TestFigureTargets(t *testing.T) {
	f := newFigure("x", "/s", 90, "raw", 100, ratioAtLeast(0.8))
	if f.Met == nil || !*f.Met || math.Abs(f.Ratio-0.9) > 1e-9 {
		t.Errorf("90 vs 100 with target ≥ 0.8×: got ratio %v met %v, want 0.9 met", f.Ratio, f.Met)
	}
	f = newFigure("lag", "ms", 60, "naive", 1000, ratioAtMost(0.05), valueAtMost(50))
	if f.Met == nil || *f.Met {
		t.Errorf("lag 60 ms with target ≤ 50 ms: got met %v, want missed", f.Met)
	}
	f = newFigure("x", "/s", 90, "raw", 0, ratioAtLeast(0.8))
	if f.Met != nil {
		t.Errorf("a ratio target without a baseline: got met %v, want not judged", *f.Met)
	}
}

func TestCPUAtCommonRate(t *testing.T) {
	a := []rampResult{{Steps: []rampStep{{Offered: 10, CPUus: 5, OK: true}, {Offered: 20, CPUus: 4, OK: true}, {Offered: 30, CPUus: 3, OK: true}}}}
	b := []rampResult{{Steps: []rampStep{{Offered: 10, CPUus: 2, OK: true}, {Offered: 20, CPUus: 1.5, OK: true}, {Offered: 30, OK: false}}}}
	rate, ca, cb, ok := cpuAtCommonRate(a, b)
	if !ok || rate != 20 || ca != 4 || cb != 1.5 {
		t.Errorf("got rate %v cpu %v/%v ok %v, want 20, 4/1.5, true", rate, ca, cb, ok)
	}
}

func TestRenderMarkdownMarksMissedTargets(t *testing.T) {
	r := &Results{Profile: "quick", Command: "sigwatch-bench -profile quick", Commit: "abc", Machine: Machine{Cores: 2, Versions: map[string]string{"redis": "7.0.15"}}}
	r.add(Scenario{ID: 2, Name: "write", Title: "Redis write path", Baselines: []string{"raw ZADD."},
		Figures: []Figure{newFigure("deadline writes/s", "/s", 150_000, "raw ZADD GT", 300_000, ratioAtLeast(0.9))}})
	r.add(Scenario{ID: 7, Name: "doubling", Title: "Doubling", Skipped: "shard doubling not implemented yet"})
	md := renderMarkdown([]*Results{r}, "The bottleneck is X.")
	for _, want := range []string{"| 2 | deadline writes/s | 150,000 /s | 300,000 /s (raw ZADD GT) | 0.50× | ≥ 0.9× | **missed** |",
		"not measured: shard doubling not implemented yet", "redis 7.0.15", "raw ZADD.", "## Analysis\n\nThe bottleneck is X."} {
		if !strings.Contains(md, want) {
			t.Errorf("RESULTS.md lacks %q:\n%s", want, md)
		}
	}
}

// TestResultsMarkdownIsRendered fails when RESULTS.md is not exactly what
// the results-<profile>.json files and ANALYSIS.md beside it render: no
// figure in it is edited by hand, and none is left from an older run.
func TestResultsMarkdownIsRendered(t *testing.T) {
	want, err := rendered(".")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("RESULTS.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("RESULTS.md differs from what results-*.json and ANALYSIS.md render: run `go run ./cmd/sigwatch-bench -render`")
	}
}
