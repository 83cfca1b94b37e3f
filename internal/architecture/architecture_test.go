package architecture

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLayoutHolds checks this repository against every rule.
func TestLayoutHolds(t *testing.T) {
	tr, err := readTree("../..")
	if err != nil {
		t.Fatal(err)
	}
	if tr.module != "github.com/sigwatch/sigwatch" {
		t.Fatalf("read module %q", tr.module)
	}
	if len(tr.files) < 15 {
		t.Fatalf("read only %d packages", len(tr.files))
	}
	for _, v := range tr.check() {
		t.Error(v)
	}
}

// clean is a small module that keeps every rule; each planted violation
// below changes or adds one file.
var clean = map[string]string{
	"go.mod":              "module example.com/m\n",
	"cmd/sigwatch/doc.go": "// main.go wires; demo.go shows.\npackage main\n",
	"cmd/sigwatch/main.go": `package main

import (
	_ "example.com/m/api"
	_ "example.com/m/ingest"
)
`,
	"api/doc.go":   "// Files: api.go.\npackage api\n",
	"api/api.go":   "package api\n\nimport _ \"example.com/m/alarm\"\n",
	"alarm/doc.go": "// alarm.go, store.go.\npackage alarm\n",
	"alarm/alarm.go": `package alarm

import (
	_ "example.com/m/dispatch"
	_ "example.com/m/shard/queue"
)
`,
	"alarm/store.go":              "package alarm\n\nimport _ \"example.com/m/shard\"\n",
	"alarm/alarm_test.go":         "package alarm\n\nimport (\n\t_ \"example.com/m/ingest\"\n\t_ \"github.com/redis/rueidis\"\n\t_ \"example.com/m/internal/testenv\"\n)\n",
	"ingest/doc.go":               "// ingest.go\npackage ingest\n",
	"ingest/ingest.go":            "package ingest\n\nimport _ \"example.com/m/shard\"\n",
	"shard/queue/doc.go":          "// queue.go\npackage queue\n",
	"shard/queue/queue.go":        "package queue\n\nimport _ \"example.com/m/shard\"\n",
	"shard/doc.go":                "// shard.go; see also ../dispatch/publish.go\npackage shard\n",
	"shard/shard.go":              "package shard\n\nimport _ \"github.com/redis/rueidis\"\n",
	"dispatch/doc.go":             "// publish.go\npackage dispatch\n",
	"dispatch/publish.go":         "package dispatch\n\nimport (\n\t_ \"github.com/nats-io/nats.go/jetstream\"\n\t_ \"example.com/m/internal/backoff\"\n)\n",
	"internal/backoff/doc.go":     "// backoff.go\npackage backoff\n",
	"internal/backoff/backoff.go": "package backoff\n",
	"internal/testenv/doc.go":     "// testenv.go\npackage testenv\n",
	"internal/testenv/testenv.go": "package testenv\n\nimport _ \"example.com/m/shard\"\n",
	"cmd/sigwatch/demo.go":        "//go:build demo\n\npackage main\n\nimport _ \"example.com/m/internal/testenv\"\n",
	"bench/go.mod":                "module example.com/m/bench\n",
	"bench/huge.go":               "package bench\n\nimport _ \"example.com/m/shard\"\n" + strings.Repeat("\n", 500),
}

func plant(t *testing.T, change map[string]string) *tree {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{}
	for k, v := range clean {
		files[k] = v
	}
	for k, v := range change {
		if v == "" {
			delete(files, k)
		} else {
			files[k] = v
		}
	}
	for name, src := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := readTree(root)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestRulesCatchPlantedViolations plants one violation of each rule in a
// clean tree and requires the check to report exactly it.
func TestRulesCatchPlantedViolations(t *testing.T) {
	if bad := plant(t, nil).check(); len(bad) > 0 {
		t.Fatalf("the clean tree fails: %q", bad)
	}
	cases := []struct {
		name   string
		change map[string]string
		want   string
	}{
		{"a role imports a role",
			map[string]string{"timer/doc.go": "// timer.go\npackage timer\n",
				"timer/timer.go": "package timer\n\nimport _ \"example.com/m/ingest\"\n"},
			"timer/timer.go: imports ingest; roles import none of each other"},
		{"a floor imports one above it",
			map[string]string{"shard/up.go": "package shard\n\nimport _ \"example.com/m/alarm\"\n",
				"shard/doc.go": "// shard.go up.go\npackage shard\n"},
			"shard/up.go: imports alarm, a floor up (doors → roles)"},
		{"shard imports dispatch",
			map[string]string{"shard/shard.go": "package shard\n\nimport _ \"example.com/m/dispatch\"\n"},
			"shard/shard.go: imports dispatch; doors import none of each other"},
		{"a package without a floor",
			map[string]string{"util/doc.go": "// util.go\npackage util\n", "util/util.go": "package util\n"},
			"util: package has no floor"},
		{"rueidis outside shard",
			map[string]string{"alarm/store.go": "package alarm\n\nimport _ \"github.com/redis/rueidis\"\n"},
			"alarm/store.go: imports github.com/redis/rueidis, which only shard may import"},
		{"nats.go outside dispatch",
			map[string]string{"alarm/store.go": "package alarm\n\nimport _ \"github.com/nats-io/nats.go\"\n"},
			"alarm/store.go: imports github.com/nats-io/nats.go, which only dispatch may import"},
		{"a test kit in the service",
			map[string]string{"ingest/ingest.go": "package ingest\n\nimport _ \"example.com/m/internal/testenv\"\n"},
			"ingest/ingest.go: imports the test kit internal/testenv"},
		{"a file over 400 lines",
			map[string]string{"alarm/store.go": "package alarm\n" + strings.Repeat("// line\n", 400)},
			"alarm/store.go: 401 lines, over 400"},
		{"a file the map does not name",
			map[string]string{"alarm/mute.go": "package alarm\n"},
			"alarm/doc.go: the file map does not name mute.go"},
		{"a map naming a file that is gone",
			map[string]string{"alarm/store.go": ""},
			"alarm/doc.go: names store.go, which is not in the folder"},
		{"a package without doc.go",
			map[string]string{"ingest/doc.go": ""},
			"ingest: no doc.go with a file map"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bad := plant(t, c.change).check()
			if len(bad) != 1 || !strings.HasPrefix(bad[0], c.want) {
				t.Fatalf("got %q, want one violation starting %q", bad, c.want)
			}
		})
	}
	// A role's tests may wire other roles and reach servers directly, the
	// demo may use the kits, and another module (bench/) is not read: the
	// clean tree holds all three.
	if !slices.Contains(plant(t, nil).names["alarm"], "alarm_test.go") {
		t.Fatal("the clean tree lost its test file")
	}
}
