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

// TestDockerfileImage: the final image runs the copied binary as a non-root
// user, on port 8080, with the config path the compose file and the
// Kubernetes manifests mount, and the compose health checks call that binary.
func TestDockerfileImage(t *testing.T) {
	last := func(kind string) string {
		ins, err := dockerfileInstructions(kind)
		if err != nil || len(ins) == 0 {
			t.Fatalf("Dockerfile: no %s (%v)", kind, err)
		}
		return ins[len(ins)-1]
	}
	froms, _ := dockerfileInstructions("FROM")
	if len(froms) < 2 || !strings.HasPrefix(froms[0], "golang:1.26") {
		t.Errorf("FROM %v: want a golang:1.26 build stage and a final stage", froms)
	}
	if user := last("USER"); strings.HasPrefix(user, "root") || strings.HasPrefix(user, "0") {
		t.Errorf("USER %s: want a non-root user", user)
	}
	if expose := last("EXPOSE"); expose != "8080" {
		t.Errorf("EXPOSE %s, want 8080", expose)
	}
	copies, _ := dockerfileInstructions("COPY")
	var bin string
	for _, c := range copies {
		if f := strings.Fields(c); len(f) == 3 && strings.HasPrefix(f[0], "--from=") {
			bin = f[2]
		}
	}
	if entry := last("ENTRYPOINT"); entry != `["`+bin+`"]` {
		t.Errorf("ENTRYPOINT %s: want the copied binary %s", entry, bin)
	}
	if cmd := last("CMD"); cmd != `["run", "--config", "/etc/sigwatch/sigwatch.yaml"]` {
		t.Errorf("CMD %s: want run --config /etc/sigwatch/sigwatch.yaml", cmd)
	}
	c := loadCompose(t)
	for name, s := range c.Services {
		if strings.HasPrefix(name, "sigwatch") && (s.Healthcheck == nil || len(s.Healthcheck.Test) < 3 ||
			s.Healthcheck.Test[1] != bin || s.Healthcheck.Test[2] != "healthcheck") {
			t.Errorf("compose %s: healthcheck %v: want [CMD %s healthcheck ...]", name, s.Healthcheck, bin)
		}
	}
}
