package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// packagePrefix matches "name: " for every package of the module at the
// start of a message or of a wrapped part, as Go errors name their package.
func packagePrefix(t *testing.T) *regexp.Regexp {
	t.Helper()
	names := map[string]bool{"main": true}
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() || p == root {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if gos, _ := filepath.Glob(filepath.Join(p, "*.go")); len(gos) > 0 {
			names[d.Name()] = true
		}
		return nil
	})
	if err != nil || !names["shard"] || !names["alarm"] {
		t.Fatalf("the module's packages: %v %v", names, err)
	}
	var alt []string
	for n := range names {
		alt = append(alt, regexp.QuoteMeta(n))
	}
	return regexp.MustCompile(`(^|: )(` + strings.Join(alt, "|") + `): `)
}

// TestRefusalsSpeakPlainly: every refusal of a caller's mistake says what
// is wrong in the caller's words, without the name of the Go package that
// found it, through the API and the CLI.
func TestRefusalsSpeakPlainly(t *testing.T) {
	prefix := packagePrefix(t)
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, func(c *Config) { c.Thresholds.Default = time.Hour })
	for _, c := range []struct {
		method, path string
		body         any
		code         int
		want         string
	}{
		{"GET", "/v1/devices?state=bogus", nil, 400, `state "bogus": give watched or lost, or none for both`},
		{"GET", "/v1/devices?limit=0", nil, 400, "limit"},
		{"GET", "/v1/devices?cursor=%21%21", nil, 400, "cursor"},
		{"GET", "/v1/alarms?state=bogus", nil, 400, `state "bogus": give active`},
		{"GET", "/v1/alarms?cursor=%21%21", nil, 400, "cursor"},
		{"GET", "/v1/alarms?limit=5000", nil, 400, "limit"},
		{"POST", "/v1/devices/nobody/ack", nil, 409, "no open alarm"},
		{"POST", "/v1/fleet/ack", nil, 409, "no open storm alarm"},
		{"POST", "/v1/groups/g1/ack", nil, 409, "no open storm alarm"},
		{"POST", "/v1/mutes", map[string]any{"device": "d", "type": "t", "for": "1h"}, 400, "exactly one"},
		{"POST", "/v1/mutes", map[string]any{"device": "d", "for": "-1h"}, 400, ""},
		{"PUT", "/v1/devices/$sigwatch-x/threshold", map[string]any{"threshold": "90s"}, 400, "sigwatch's own"},
		{"PUT", "/v1/devices/d1/threshold", map[string]any{"threshold": "soon"}, 400, "threshold"},
		{"POST", "/v1/signals", []map[string]any{{"device": ""}}, 400, "empty"},
		{"PUT", "/v1/timers/bad%20queue/t1", map[string]any{"after": "1s"}, 400, "queue"},
		{"PUT", "/v1/timers/q/t1", map[string]any{"after": "never"}, 400, ""},
		{"PUT", "/v1/timers/q/$sigwatch-x", map[string]any{"after": "1s"}, 400, "sigwatch's own"},
		{"POST", "/v1/timers/q", []map[string]any{{"id": "a"}}, 400, ""},
	} {
		code, out := call(t, app, c.method, c.path, "t0ken", c.body)
		msg, _ := out["error"].(string)
		if code != c.code || msg == "" || !strings.Contains(msg, c.want) || prefix.MatchString(msg) {
			t.Errorf("%s %s: %d %q, want %d naming %q without a package name", c.method, c.path, code, msg, c.code, c.want)
		}
	}

	out, err := runCLI(t, app.HTTPAddr(), "alarm", "ls", "--state", "bogus", "--token", "t0ken")
	if err == nil || !strings.HasPrefix(out, `sigwatch: state "bogus": give active`) || prefix.MatchString(strings.TrimPrefix(out, "sigwatch: ")) {
		t.Errorf("alarm ls --state bogus: %v %q, want the state named plainly", err, out)
	}
}
