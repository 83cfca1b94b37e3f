package sinks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sigwatch/sigwatch/internal/webhooks"
)

// TestSecretsFromEnvAndFiles: a sink's secrets come from the variables and
// files it names; a missing, empty or malformed one is refused naming the
// key and the variable or file, never the secret.
func TestSecretsFromEnvAndFiles(t *testing.T) {
	sec := webhooks.NewSecret()
	dir := t.TempDir()
	file := filepath.Join(dir, "secret")
	if err := os.WriteFile(file, []byte(sec.Reveal()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"URL": "https://hooks.example/abc-secret-path", "OLD": sec.Reveal(), "BAD": "not-a-secret-at-all"}
	getenv := func(k string) string { return env[k] }

	c := Config{Name: "erp", Type: TypeWebhook, URLEnv: "URL", SecretsEnv: []string{"OLD"}, SecretsFile: []string{file}}
	s, err := c.resolve(getenv)
	if err != nil || s.url != env["URL"] || len(s.signing) != 2 {
		t.Fatalf("resolve: %v, url %q, %d secrets; want the URL and 2 secrets", err, s.url, len(s.signing))
	}
	for _, bad := range []struct {
		c    Config
		want string
	}{
		{Config{Name: "a", URLEnv: "NOPE"}, "sink a: url: the variable NOPE is empty or not set"},
		{Config{Name: "a", URLFile: filepath.Join(dir, "missing")}, "sink a: url: cannot read " + filepath.Join(dir, "missing")},
		{Config{Name: "a", URLEnv: "URL", SecretsEnv: []string{"BAD"}}, "sink a: secrets_env: BAD:"},
		{Config{Name: "a", RoutingKeyEnv: "NOPE"}, "sink a: routing_key: the variable NOPE is empty or not set"},
	} {
		_, err := bad.c.resolve(getenv)
		if err == nil || !strings.HasPrefix(err.Error(), bad.want) {
			t.Errorf("%+v: got %v, want %q", bad.c, err, bad.want)
			continue
		}
		for _, secret := range []string{env["BAD"], env["URL"]} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error %q repeats a secret", err)
			}
		}
	}
}
