package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Results is everything one run measured. results.json holds it as is;
// RESULTS.md is rendered from it and never edited by hand.
type Results struct {
	Profile   string       `json:"profile"`
	Command   string       `json:"command"`
	Started   string       `json:"started"`
	Duration  string       `json:"duration"`
	Commit    string       `json:"commit"`
	Machine   Machine      `json:"machine"`
	Scenarios []Scenario   `json:"scenarios"`
	Profiles  []CPUProfile `json:"cpu_profiles,omitempty"`
	Failures  []string     `json:"failures,omitempty"`
}

// Scenario is one numbered scenario of the issue and its figures.
type Scenario struct {
	ID        int      `json:"id"`
	Name      string   `json:"name"`
	Title     string   `json:"title"`
	Baselines []string `json:"baselines"` // one honest sentence per baseline
	Figures   []Figure `json:"figures"`
	Notes     []string `json:"notes,omitempty"`
	Skipped   string   `json:"skipped,omitempty"` // why it was not measured
}

// Figure is one measured figure of sigwatch and of its baseline.
type Figure struct {
	Name         string   `json:"name"`
	Unit         string   `json:"unit"`
	Sigwatch     float64  `json:"sigwatch"`
	Baseline     float64  `json:"baseline,omitempty"`
	BaselineName string   `json:"baseline_name,omitempty"`
	Ratio        float64  `json:"ratio,omitempty"` // sigwatch / baseline
	Targets      []Target `json:"targets,omitempty"`
	Met          *bool    `json:"met,omitempty"`
	Detail       string   `json:"detail,omitempty"`
}

// Target is a figure to reach: Of "ratio" compares the ratio, Of "value"
// the sigwatch figure itself.
type Target struct {
	Of    string  `json:"of"`
	Op    string  `json:"op"` // ">=" or "<="
	Value float64 `json:"value"`
}

func (t Target) met(f Figure) bool {
	v := f.Sigwatch
	if t.Of == "ratio" {
		v = f.Ratio
	}
	if t.Op == ">=" {
		return v >= t.Value
	}
	return v <= t.Value
}

func (t Target) String() string {
	op := map[string]string{">=": "≥", "<=": "≤"}[t.Op]
	if t.Of == "ratio" {
		return fmt.Sprintf("%s %s×", op, trimFloat(t.Value))
	}
	return fmt.Sprintf("%s %s", op, trimFloat(t.Value))
}

// CPUProfile is a CPU profile taken in-process and its top costs.
type CPUProfile struct {
	Name string   `json:"name"`
	What string   `json:"what"`
	File string   `json:"file"`
	Top  []string `json:"top"` // `go tool pprof -top` lines
}

// newFigure computes the ratio and whether the targets are met.
func newFigure(name, unit string, sigwatch float64, baselineName string, baseline float64, targets ...Target) Figure {
	f := Figure{Name: name, Unit: unit, Sigwatch: sigwatch, BaselineName: baselineName, Baseline: baseline, Targets: targets}
	if baseline > 0 {
		f.Ratio = sigwatch / baseline
	}
	if len(targets) > 0 {
		met := true
		for _, t := range targets {
			// A ratio target with no baseline cannot be judged.
			if t.Of == "ratio" && baseline <= 0 {
				return f
			}
			met = met && t.met(f)
		}
		f.Met = &met
	}
	return f
}

func ratioAtLeast(v float64) Target { return Target{Of: "ratio", Op: ">=", Value: v} }
func ratioAtMost(v float64) Target  { return Target{Of: "ratio", Op: "<=", Value: v} }
func valueAtMost(v float64) Target  { return Target{Of: "value", Op: "<=", Value: v} }

// add records a scenario, replacing one of the same name and id.
func (r *Results) add(s Scenario) {
	for i := range r.Scenarios {
		if r.Scenarios[i].ID == s.ID && r.Scenarios[i].Name == s.Name {
			r.Scenarios[i] = s
			return
		}
	}
	r.Scenarios = append(r.Scenarios, s)
}

func (r *Results) sortScenarios() {
	sort.SliceStable(r.Scenarios, func(i, j int) bool { return r.Scenarios[i].ID < r.Scenarios[j].ID })
}

// write stores results.json and, for a complete run, results-<profile>.json
// and RESULTS.md (rendered from every results-<profile>.json present, so a
// quick run keeps the full profile's figures). It also prints the table.
func (r *Results) write(dir string, complete bool) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if err := os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644); err != nil {
		return fmt.Errorf("bench: write results.json: %w", err)
	}
	if !complete {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "results-"+r.Profile+".json"), b, 0o644); err != nil {
		return fmt.Errorf("bench: write results-%s.json: %w", r.Profile, err)
	}
	return render(dir)
}

// merge replaces, in dir/results-<profile>.json, the scenarios and CPU
// profiles of this partial run, each scenario noting the run that measured
// it, and renders RESULTS.md again.
func (r *Results) merge(dir string) error {
	path := filepath.Join(dir, "results-"+r.Profile+".json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("bench: merge: no complete %s run to merge into: %w", r.Profile, err)
	}
	var all Results
	if err := json.Unmarshal(raw, &all); err != nil {
		return fmt.Errorf("bench: merge: read %s: %w", path, err)
	}
	for _, s := range r.Scenarios {
		s.Notes = append(s.Notes, fmt.Sprintf("Measured by a partial run merged in: `%s` at commit `%s`, %s, took %s; "+
			"load average before it: %s.", r.Command, r.Commit, r.Started, r.Duration, r.Machine.LoadAtStart))
		all.add(s)
	}
	for _, p := range r.Profiles {
		kept := all.Profiles[:0]
		for _, q := range all.Profiles {
			if q.Name != p.Name {
				kept = append(kept, q)
			}
		}
		all.Profiles = append(kept, p)
	}
	all.sortScenarios()
	b, err := json.MarshalIndent(&all, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: merge: write %s: %w", path, err)
	}
	return render(dir)
}

// render writes dir/RESULTS.md from every results-<profile>.json in dir and
// the hand-written dir/ANALYSIS.md.
func render(dir string) error {
	md, err := rendered(dir)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "RESULTS.md"), []byte(md), 0o644); err != nil {
		return fmt.Errorf("bench: write RESULTS.md: %w", err)
	}
	return nil
}

// rendered is what RESULTS.md in dir must hold: what every
// results-<profile>.json in dir and dir/ANALYSIS.md render.
func rendered(dir string) (string, error) {
	var runs []*Results
	for _, name := range []string{"full", "quick"} {
		raw, err := os.ReadFile(filepath.Join(dir, "results-"+name+".json"))
		if err != nil {
			continue
		}
		var rr Results
		if err := json.Unmarshal(raw, &rr); err != nil {
			return "", fmt.Errorf("bench: read results-%s.json: %w", name, err)
		}
		runs = append(runs, &rr)
	}
	analysis, _ := os.ReadFile(filepath.Join(dir, "ANALYSIS.md"))
	return renderMarkdown(runs, string(analysis)), nil
}

// renderMarkdown renders RESULTS.md from the runs (full profile first) and
// the hand-written analysis, which holds prose but no figures.
func renderMarkdown(runs []*Results, analysis string) string {
	var b strings.Builder
	b.WriteString("# sigwatch benchmark results\n\n")
	b.WriteString("Generated by the `bench` harness (`make bench` runs the quick profile; " +
		"`cd bench && go run ./cmd/sigwatch-bench -profile full` the full one). Do not edit: every figure below " +
		"comes from `results-<profile>.json`, written by the run that measured it; the prose at the end " +
		"comes from `ANALYSIS.md`.\n\n")
	b.WriteString("Each figure is measured side by side with its baseline in the same run on the same machine; " +
		"the ratio is sigwatch ÷ baseline. Targets come from issue 5 and are reported, never asserted.\n\n")
	if len(runs) == 0 {
		b.WriteString("No complete run yet.\n")
	}
	for _, r := range runs {
		renderRun(&b, r)
	}
	if len(runs) > 0 {
		b.WriteString("## Baselines\n\n")
		for _, s := range runs[0].Scenarios {
			for _, d := range s.Baselines {
				fmt.Fprintf(&b, "- **%d. %s** — %s\n", s.ID, s.Title, d)
			}
		}
		b.WriteString("\n")
	}
	if a := strings.TrimSpace(analysis); a != "" {
		b.WriteString("## Analysis\n\n")
		b.WriteString(a)
		b.WriteString("\n")
	}
	return b.String()
}

func renderRun(b *strings.Builder, r *Results) {
	fmt.Fprintf(b, "## Profile `%s` — %s\n\n", r.Profile, r.Started)
	fmt.Fprintf(b, "- command: `%s`\n", r.Command)
	fmt.Fprintf(b, "- commit: `%s`; run took %s\n", r.Commit, r.Duration)
	m := r.Machine
	fmt.Fprintf(b, "- machine: %d cores", m.Cores)
	if m.CPU != "" {
		fmt.Fprintf(b, " (%s)", m.CPU)
	}
	fmt.Fprintf(b, ", %.1f GB memory, %s; load generator, servers and sigwatch share it\n", m.MemoryGB, m.OS)
	if m.LoadAtStart != "" {
		fmt.Fprintf(b, "- load average before the run started (1, 5, 15 min): %s — other work on a shared machine adds noise\n", m.LoadAtStart)
	}
	var vs []string
	for _, k := range []string{"redis", "mosquitto", "nats-server", "postgresql", "go", "rueidis", "nats.go", "paho", "asynq", "pgx"} {
		if v, ok := m.Versions[k]; ok && v != "" {
			vs = append(vs, k+" "+v)
		}
	}
	fmt.Fprintf(b, "- versions: %s\n\n", strings.Join(vs, ", "))

	b.WriteString("| # | figure | sigwatch | baseline | ratio | target | |\n")
	b.WriteString("|---|---|---:|---:|---:|---|---|\n")
	for _, s := range r.Scenarios {
		if s.Skipped != "" {
			fmt.Fprintf(b, "| %d | %s | — | — | — | | not measured: %s |\n", s.ID, s.Title, s.Skipped)
			continue
		}
		for _, f := range s.Figures {
			base := "—"
			if f.BaselineName != "" {
				base = fmt.Sprintf("%s (%s)", formatValue(f.Baseline, f.Unit), f.BaselineName)
			}
			ratio := "—"
			if f.Ratio > 0 {
				ratio = fmt.Sprintf("%.2f×", f.Ratio)
			}
			var ts []string
			for _, t := range f.Targets {
				s := t.String()
				if t.Of == "value" {
					s += " " + f.Unit
				}
				ts = append(ts, s)
			}
			verdict := ""
			if f.Met != nil {
				verdict = "met"
				if !*f.Met {
					verdict = "**missed**"
				}
			}
			fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %s | %s |\n", s.ID, f.Name, formatValue(f.Sigwatch, f.Unit),
				base, ratio, strings.Join(ts, ", "), verdict)
		}
	}
	b.WriteString("\n")
	for _, s := range r.Scenarios {
		var lines []string
		for _, f := range s.Figures {
			if f.Detail != "" {
				lines = append(lines, fmt.Sprintf("%s: %s", f.Name, f.Detail))
			}
		}
		lines = append(lines, s.Notes...)
		if len(lines) == 0 {
			continue
		}
		fmt.Fprintf(b, "**%d. %s.**\n", s.ID, s.Title)
		for _, l := range lines {
			fmt.Fprintf(b, "- %s\n", l)
		}
		b.WriteString("\n")
	}
	if len(r.Failures) > 0 {
		b.WriteString("Failures in this run:\n")
		for _, f := range r.Failures {
			fmt.Fprintf(b, "- %s\n", f)
		}
		b.WriteString("\n")
	}
	for _, p := range r.Profiles {
		fmt.Fprintf(b, "### CPU profile: %s\n\n%s (`%s`). Top costs (`go tool pprof -top`):\n\n```\n%s\n```\n\n",
			p.Name, p.What, p.File, strings.Join(p.Top, "\n"))
	}
}

// formatValue prints v in unit with sensible precision.
func formatValue(v float64, unit string) string {
	switch {
	case unit == "":
		return trimFloat(v)
	case math.Abs(v) >= 10_000:
		return fmt.Sprintf("%s %s", groupThousands(int64(math.Round(v))), unit)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f %s", v, unit)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f %s", v, unit)
	default:
		return fmt.Sprintf("%.2f %s", v, unit)
	}
}

func groupThousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []string
	for len(s) > 3 {
		out = append([]string{s[len(s)-3:]}, out...)
		s = s[:len(s)-3]
	}
	out = append([]string{s}, out...)
	r := strings.Join(out, ",")
	if neg {
		r = "-" + r
	}
	return r
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

// summary is the table of this run, printed at the end as progress.
func (r *Results) summary() string {
	var b strings.Builder
	renderRun(&b, r)
	return b.String()
}
