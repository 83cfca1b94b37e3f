package check

import (
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDockerBuildIsStatic: the Dockerfile's go build command, run here as
// written, gives a static binary (no ELF interpreter, no dynamic section),
// so it runs on distroless static; it is the service, without the demo.
func TestDockerBuildIsStatic(t *testing.T) {
	bin := sigwatchBinary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s has a %s program header: not static", bin, p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s imports %v: not static", bin, libs)
	}
	if s := f.Section(".symtab"); s != nil {
		t.Errorf("%s keeps its symbol table: -s -w did not apply", bin)
	}
	if out, err := runSigwatch(t, nil, "demo"); err == nil || !strings.Contains(out, "built without the demo") {
		t.Errorf("sigwatch demo in the image build: %q, want the refusal of a build without the demo tag", out)
	}
}

// TestDockerfileCopiesWhatExists: every path the Dockerfile COPYs from the
// build context exists and is not left out by .dockerignore.
func TestDockerfileCopiesWhatExists(t *testing.T) {
	copies, err := dockerfileInstructions("COPY")
	if err != nil {
		t.Fatal(err)
	}
	ignored := dockerignore(t)
	n := 0
	for _, c := range copies {
		words := strings.Fields(c)
		if len(words) > 0 && strings.HasPrefix(words[0], "--from=") {
			continue // from another stage
		}
		var srcs []string
		for _, w := range words[:len(words)-1] {
			if !strings.HasPrefix(w, "--") {
				srcs = append(srcs, w)
			}
		}
		for _, src := range srcs {
			n++
			if src == "." {
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot, src)); err != nil {
				t.Errorf("COPY %s: %v", src, err)
			}
			if pat := ignoredBy(ignored, src); pat != "" {
				t.Errorf("COPY %s: left out of the build context by .dockerignore's %q", src, pat)
			}
		}
	}
	if n == 0 {
		t.Fatal("no COPY from the build context found")
	}
	// What the build itself needs must not be ignored either.
	for _, p := range []string{"go.mod", "go.sum", "cmd/sigwatch/main.go", "shard/doc.go"} {
		if pat := ignoredBy(ignored, p); pat != "" {
			t.Errorf("%s is left out of the build context by .dockerignore's %q", p, pat)
		}
	}
}

func dockerignore(t *testing.T) []string {
	b, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var pats []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			pats = append(pats, strings.TrimSuffix(strings.TrimPrefix(l, "/"), "/"))
		}
	}
	return pats
}

// ignoredBy returns the pattern that leaves path or one of its parents out,
// or "" (plain and ** patterns, the kinds .dockerignore uses here).
func ignoredBy(pats []string, path string) string {
	for p := path; p != "." && p != "/"; p = filepath.Dir(p) {
		for _, pat := range pats {
			if strings.HasPrefix(pat, "!") {
				continue
			}
			if ok, _ := filepath.Match(strings.TrimPrefix(pat, "**/"), filepath.Base(p)); ok && strings.HasPrefix(pat, "**/") {
				return pat
			}
			if ok, _ := filepath.Match(pat, p); ok {
				return pat
			}
		}
	}
	return ""
}
