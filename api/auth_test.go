package api

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestTokenConfigErrors: each mistake in http.tokens is refused in one
// line naming the token and what to change.
func TestTokenConfigErrors(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TOK_OK", "0123456789abcdef0123")
	ok := TokenConfig{Name: "ok", Role: "viewer", TokenEnv: "TOK_OK"}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no name", Config{Tokens: []TokenConfig{{Role: "viewer", TokenEnv: "TOK_OK"}}}, "http.tokens[0]: give the token a name"},
		{"twice", Config{Tokens: []TokenConfig{ok, ok}}, "http.tokens ok: the name is used twice"},
		{"role", Config{Tokens: []TokenConfig{{Name: "x", Role: "root", TokenEnv: "TOK_OK"}}}, `http.tokens x: role "root": want viewer, operator, admin or metrics`},
		{"both", Config{Tokens: []TokenConfig{{Name: "x", Role: "viewer", TokenEnv: "TOK_OK", TokenFile: short}}}, "give the token through token_env or token_file (one of them)"},
		{"neither", Config{Tokens: []TokenConfig{{Name: "x", Role: "viewer"}}}, "give the token through token_env or token_file (one of them)"},
		{"unset", Config{Tokens: []TokenConfig{{Name: "x", Role: "viewer", TokenEnv: "TOK_UNSET"}}}, "http.tokens x: the variable TOK_UNSET is not set"},
		{"missing file", Config{Tokens: []TokenConfig{{Name: "x", Role: "viewer", TokenFile: filepath.Join(dir, "nope")}}}, "http.tokens x: token_file: open"},
		{"short", Config{Tokens: []TokenConfig{{Name: "x", Role: "viewer", TokenFile: short}}}, "http.tokens x: the token is 3 characters long, want at least 16"},
		{"metrics auth", Config{MetricsAuth: "basic"}, `http.metrics_auth "basic": want open or token`},
		{"metrics auth without tokens", Config{MetricsAuth: "token"}, "http.metrics_auth token: set http.tokens"},
		{"open to the network", Config{Addr: "0.0.0.0:8080"}, "http.addr 0.0.0.0:8080 is not loopback: set http.tokens or http.token"},
	} {
		c := DefaultConfig()
		if tc.cfg.Addr != "" {
			c.Addr = tc.cfg.Addr
		}
		c.Tokens, c.MetricsAuth = tc.cfg.Tokens, tc.cfg.MetricsAuth
		if c.MetricsAuth == "" {
			c.MetricsAuth = "open"
		}
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line with %q", tc.name, err, tc.want)
		}
	}
	c := DefaultConfig()
	c.Addr, c.Tokens, c.MetricsAuth = "0.0.0.0:8080", []TokenConfig{ok}, "token"
	if err := c.Validate(); err != nil {
		t.Errorf("a viewer token on the network: %v", err)
	}
}

// TestTokensMatchByDigest: a token is known by its digest alone and names
// its caller; a prefix, a longer one or another's is not taken.
func TestTokensMatchByDigest(t *testing.T) {
	t.Setenv("TOK_A", "aaaaaaaaaaaaaaaa-1")
	t.Setenv("TOK_B", "bbbbbbbbbbbbbbbb-2")
	s := &tokenSet{cfg: Config{Token: "legacy", Tokens: []TokenConfig{
		{Name: "a", Role: "viewer", TokenEnv: "TOK_A"}, {Name: "b", Role: "operator", TokenEnv: "TOK_B"}}}, getenv: os.Getenv}
	if err := s.reload(); err != nil {
		t.Fatal(err)
	}
	for presented, want := range map[string]Caller{
		"aaaaaaaaaaaaaaaa-1": {"a", RoleViewer}, "bbbbbbbbbbbbbbbb-2": {"b", RoleOperator}, "legacy": {"http.token", RoleAdmin},
	} {
		if got, ok := s.match(presented); !ok || got != want {
			t.Errorf("%s: %v %v, want %v", presented, got, ok, want)
		}
	}
	for _, bad := range []string{"", "aaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaa-12", "legacy ", "LEGACY"} {
		if got, ok := s.match(bad); ok {
			t.Errorf("%q taken as %v", bad, got)
		}
	}
}

// TestSecurityHeaders: every answer carries the usual headers; the status
// page keeps its Content-Security-Policy and /v1 is never cached.
func TestSecurityHeaders(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv := httptest.NewServer(New(Options{Gatherer: reg, Registerer: reg, Now: time.Now, Stalled: func() []string { return nil }}).Handler())
	defer srv.Close()
	for _, path := range []string{"/", "/v1/whoami", "/metrics", "/healthz", "/v1/no-such-route"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := resp.Header
		for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"} {
			if h.Get(k) != v {
				t.Errorf("%s: %s %q, want %q", path, k, h.Get(k), v)
			}
		}
		if strings.HasPrefix(path, "/v1/") && h.Get("Cache-Control") != "no-store" {
			t.Errorf("%s: Cache-Control %q, want no-store", path, h.Get("Cache-Control"))
		}
		if path == "/" && !strings.Contains(h.Get("Content-Security-Policy"), "script-src 'self'") {
			t.Errorf("/: Content-Security-Policy %q", h.Get("Content-Security-Policy"))
		}
	}
}
