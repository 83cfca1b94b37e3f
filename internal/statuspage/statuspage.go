package statuspage

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed ui
var files embed.FS

// Handler serves the page at / and its assets under /ui/.
func Handler() http.Handler {
	ui, err := fs.Sub(files, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	assets := http.StripPrefix("/ui/", http.FileServerFS(ui))
	index, err := fs.ReadFile(ui, "index.html")
	if err != nil {
		panic(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Only the page's own script and style run: data the script puts
		// into the DOM can never become code, even if escaping were missed.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// A new binary brings a new page: browsers revalidate every time.
		h.Set("Cache-Control", "no-cache")
		switch {
		case strings.HasSuffix(r.URL.Path, "/") && r.URL.Path != "/":
			http.NotFound(w, r) // no directory listings
			return
		case r.URL.Path == "/":
			h.Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write(index)
			return
		}
		assets.ServeHTTP(w, r)
	})
}
