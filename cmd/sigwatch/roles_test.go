package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// roleTokens are the tokens of TestEveryRouteEveryRole, one per role.
var roleTokens = map[string]string{
	"metrics":  "metrics-0123456789abcdef",
	"viewer":   "viewer-0123456789abcdef",
	"operator": "operator-0123456789abcdef",
	"admin":    "admin-0123456789abcdef",
}

// matrixPath fills a route's wildcards with values every handler accepts
// as well formed.
func matrixPath(p string) string {
	p = strings.ReplaceAll(p, "{$}", "")
	return strings.NewReplacer("{id}", "matrix-dev", "{id...}", "t1", "{type}", "matrix", "{group}", "g1",
		"{name}", "nosuch", "{queue}", "q1").Replace(p)
}

// TestEveryRouteEveryRole calls every route the API declares with every
// kind of caller: no token, a wrong one, one revoked on SIGHUP, a token
// of each role and the legacy http.token. A route is refused (401 without
// a good token, 403 below its role) exactly when its declaration says so;
// a route added without a role cannot be declared at all.
func TestEveryRouteEveryRole(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	dir := t.TempDir()
	revokedFile := filepath.Join(dir, "revoked")
	const revoked = "revoked-0123456789abcdef"
	if err := os.WriteFile(revokedFile, []byte(revoked+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var tokens []api.TokenConfig
	for role, tok := range roleTokens {
		f := filepath.Join(dir, role)
		if err := os.WriteFile(f, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, api.TokenConfig{Name: role + "-bot", Role: role, TokenFile: f})
	}
	tokens = append(tokens, api.TokenConfig{Name: "old-dashboard", Role: "viewer", TokenFile: revokedFile})
	app := startApp(t, env, func(c *Config) {
		c.HTTP.Tokens = tokens
		c.HTTP.MetricsAuth = "token"
		c.Timers.Enabled = true
	})
	// The dashboard's token is rotated: its file holds a new one.
	if err := os.WriteFile(revokedFile, []byte("rotated-0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	// SIGHUP reads the tokens again, as systemctl reload does.
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the rotated token accepted", func() bool {
		code, _ := call(t, app, "GET", "/v1/whoami", "rotated-0123456789abcdef", nil)
		return code == http.StatusOK
	})

	type caller struct {
		name, token string
		role        api.Role // RoleNone: no good token
	}
	callers := []caller{{"no token", "", api.RoleNone}, {"wrong token", "wrong-0123456789abcdef", api.RoleNone},
		{"revoked token", revoked, api.RoleNone}, {"rotated token", "rotated-0123456789abcdef", api.RoleViewer},
		{"http.token", "t0ken", api.RoleAdmin}}
	for _, role := range []string{"metrics", "viewer", "operator", "admin"} {
		r, _ := api.ParseRole(role)
		callers = append(callers, caller{role, roleTokens[role], r})
	}
	routes := api.Routes(app.cfg.HTTP)
	if len(routes) < 30 {
		t.Fatalf("only %d routes declared", len(routes))
	}
	hc := &http.Client{Timeout: 15 * time.Second}
	for _, rt := range routes {
		for _, c := range callers {
			want := http.StatusOK // anything but 401 and 403
			switch {
			case rt.Role == api.RoleNone:
			case c.role == api.RoleNone:
				want = http.StatusUnauthorized
			case c.role < rt.Role:
				want = http.StatusForbidden
			}
			got := matrixCall(t, hc, app, rt, c.token)
			refused := got == http.StatusUnauthorized || got == http.StatusForbidden
			if (want == http.StatusOK && refused) || (want != http.StatusOK && got != want) {
				t.Errorf("%s %s (needs %s) as %s: %d, want %s", rt.Method, rt.Path, rt.Role, c.name, got, wantWords(want))
			}
		}
	}
	// The calls that changed something are in the audit trail under the
	// names of the tokens that made them; those refused for their token
	// are not.
	wantBy := map[string][]string{
		"device.remove": {"admin-bot", "http.token"}, "device.ack": {"admin-bot", "http.token", "operator-bot"},
		"mute.create": {"admin-bot", "http.token", "operator-bot"}, "shards.double": {"admin-bot", "http.token"},
	}
	var wrong []string
	audited := func() bool {
		code, res := call(t, app, "GET", "/v1/audit?limit=1000", roleTokens["viewer"], nil)
		if code != http.StatusOK {
			t.Fatalf("GET /v1/audit: %d %v", code, res)
		}
		who := map[string][]string{}
		recs, _ := res["records"].([]any)
		for _, r := range recs {
			m, _ := r.(map[string]any)
			who[fmt.Sprint(m["action"])] = append(who[fmt.Sprint(m["action"])], fmt.Sprint(m["who"]))
		}
		wrong = nil
		for action, want := range wantBy {
			if got := slices.Sorted(slices.Values(who[action])); !slices.Equal(got, want) {
				wrong = append(wrong, fmt.Sprintf("%s by %v, want by %v", action, got, want))
			}
		}
		return len(wrong) == 0
	}
	// The records are kept just after the answers.
	for k := 0; !audited(); k++ {
		if k == 20 {
			t.Errorf("audit records: %v", wrong)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func wantWords(code int) string {
	if code == http.StatusOK {
		return "it served"
	}
	return http.StatusText(code)
}

// matrixCall makes one call of rt and returns its status; a stream's
// status is read from its headers.
func matrixCall(t *testing.T, hc *http.Client, app *App, rt api.Route, token string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	var body *strings.Reader
	if rt.Method != "GET" && rt.Method != "DELETE" {
		body = strings.NewReader("{}")
	} else {
		body = strings.NewReader("")
	}
	req, err := http.NewRequestWithContext(ctx, rt.Method, "http://"+app.HTTPAddr()+matrixPath(rt.Path), body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", rt.Method, rt.Path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestReadmeListsEveryRouteWithItsRole: the README's HTTP table lists every
// route the API declares, and no other, each with the role it declares.
func TestReadmeListsEveryRouteWithItsRole(t *testing.T) {
	listed := readmeRoutes(t)
	want := map[string]string{}
	for _, rt := range api.Routes(DefaultConfig().HTTP) {
		want[rt.Method+" "+readmePath(rt.Path)] = rt.Role.String()
	}
	for k, role := range want {
		switch got, ok := listed[k]; {
		case !ok:
			t.Errorf("README.md's HTTP table does not list %s (role %s)", k, role)
		case got != role:
			t.Errorf("README.md's HTTP table gives %s the role %s, the route declares %s", k, got, role)
		}
	}
	for k := range listed {
		if _, ok := want[k]; !ok {
			t.Errorf("README.md's HTTP table lists %s, which is no route", k)
		}
	}
}

// readmePath is a route's path as the README writes it.
func readmePath(p string) string {
	return strings.NewReplacer("{$}", "", "{id...}", "{id}").Replace(p)
}

var spanRE = regexp.MustCompile("`([^`]*)`")

// readmeRoutes reads the HTTP table of README.md: each row's first cell
// lists routes as `METHOD|METHOD /path?query`, a bare `METHOD` sharing the
// next path and a bare `/path` the methods before it; its second cell has
// one role for them all or one per route.
func readmeRoutes(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "| endpoint | role |") {
			in = true
			continue
		}
		if !in || strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "¦"), " | ")
		if len(cells) < 3 {
			t.Fatalf("README.md HTTP table row %q: want endpoint | role | what", line)
		}
		var routes, pending, last []string
		for _, m := range spanRE.FindAllStringSubmatch(strings.TrimPrefix(cells[0], "| "), -1) {
			methods, path, hasPath := strings.Cut(m[1], " ")
			if strings.HasPrefix(m[1], "/") {
				methods, path, hasPath = "", m[1], true
			}
			ms := strings.Split(methods, "¦")
			if methods == "" {
				ms = last
			}
			if !hasPath {
				pending = append(pending, ms...)
				continue
			}
			path, _, _ = strings.Cut(path, "?")
			for _, meth := range append(pending, ms...) {
				routes = append(routes, meth+" "+path)
			}
			last, pending = ms, nil
		}
		roles := strings.Split(strings.TrimSpace(cells[1]), ", ")
		if len(roles) != 1 && len(roles) != len(routes) {
			t.Fatalf("README.md HTTP table row %q: %d roles for %d routes %v", line, len(roles), len(routes), routes)
		}
		for j, rt := range routes {
			role := roles[min(j, len(roles)-1)]
			if !slices.Contains([]string{"none", "metrics", "viewer", "operator", "admin"}, role) {
				t.Fatalf("README.md HTTP table row %q: role %q", line, role)
			}
			out[rt] = role
		}
	}
	if len(out) == 0 {
		t.Fatal("README.md has no table headed | endpoint | role |")
	}
	return out
}
