package statuspage

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Result(), string(b)
}

// The page and its assets are served from the binary, with a policy that
// runs only the page's own script and style.
func TestServesPageAndAssets(t *testing.T) {
	for path, ctype := range map[string]string{
		"/":               "text/html",
		"/ui/app.js":      "javascript",
		"/ui/style.css":   "text/css",
		"/ui/favicon.svg": "image/svg+xml",
	} {
		resp, body := get(t, path)
		if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), ctype) || body == "" {
			t.Errorf("GET %s: %d %q (%d bytes), want 200 %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body), ctype)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q, want script-src 'self'", path, csp)
		}
	}
	for _, path := range []string{"/ui/", "/ui/nope.js"} {
		if resp, _ := get(t, path); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, resp.StatusCode)
		}
	}
}

// The page's script never turns data into markup, and nothing it loads
// comes from another host: it works offline.
func TestPageBuildsDOMFromTextOnly(t *testing.T) {
	unsafe := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function`)
	remote := regexp.MustCompile(`(?:src|href)\s*=\s*["']?(?:https?:)?//|@import|url\(\s*["']?(?:https?:)?//`)
	err := fs.WalkDir(files, "ui", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := files.ReadFile(path)
		if err != nil {
			return err
		}
		if m := unsafe.Find(b); m != nil {
			t.Errorf("%s uses %s: put data into the DOM with textContent or attributes", path, m)
		}
		if m := remote.Find(b); m != nil {
			t.Errorf("%s loads %s from another host: the page must work offline", path, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
