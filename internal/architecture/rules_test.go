package architecture

import (
	"bufio"
	"fmt"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// maxLines is the most lines a non-test .go file may have.
const maxLines = 400

// floors places every package of the module, by its path inside it. A
// package imports only packages on lower floors; on a floor marked alone
// its packages import none of each other either.
var floors = []struct {
	name  string
	alone bool
	pkgs  []string
}{
	{"command", true, []string{"cmd/sigwatch"}},
	{"api", true, []string{"api"}},
	{"roles", true, []string{"ingest", "scanner", "alarm", "timer", "guard", "stats", "sinks", "presence"}},
	{"engine", true, []string{"shard/queue"}},
	{"doors", true, []string{"shard", "dispatch", "client"}},
	{"helpers", false, []string{"internal/backoff", "internal/clock", "internal/fleet", "internal/periodic",
		"internal/ratelog", "internal/statuspage", "internal/tlsconfig", "internal/liveness", "internal/yamlenv",
		"internal/architecture", "internal/docs", "internal/minversion", "internal/sparkplug", "internal/webhooks"}},
}

// kits are the test kits: they start real servers and may import anything
// below the command, and only tests and the demo may import them.
var kits = []string{"internal/servers", "internal/servers/natsd", "internal/testenv"}

// doors says which packages alone may import a client library, and who
// else may: client is the Go library users import, the kits start and
// watch servers, the demo (build tag demo) embeds them all.
var doors = []struct {
	prefix string
	owner  string
	others []string
}{
	{"github.com/redis/rueidis", "shard", nil},
	{"github.com/nats-io/nats.go", "dispatch", []string{"client", "internal/servers", "internal/testenv"}},
}

// file is what the check reads of one .go file.
type file struct {
	path    string // relative to the tree's root, slash-separated
	pkg     string // its folder, the package's path inside the module
	test    bool
	demo    bool // built only with the demo tag
	gen     bool // generated (a "Code generated ... DO NOT EDIT." line before the package clause)
	lines   int
	imports []string
}

// tree is every package folder of one module.
type tree struct {
	module string
	files  map[string][]file // by package
	docs   map[string]string // doc.go comment text, by package
	names  map[string][]string
}

// readTree reads the module at root. Folders holding a go.mod of their own
// (bench/, deploy/check) are other modules and are not read.
func readTree(root string) (*tree, error) {
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	t := &tree{files: map[string][]file{}, docs: map[string]string{}, names: map[string][]string{}}
	for line := range strings.Lines(string(mod)) {
		if m, ok := strings.CutPrefix(line, "module "); ok {
			t.module = strings.TrimSpace(m)
		}
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "." {
				return nil
			}
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") {
			return nil
		}
		f, err := readFile(root, rel)
		if err != nil {
			return err
		}
		t.files[f.pkg] = append(t.files[f.pkg], f)
		t.names[f.pkg] = append(t.names[f.pkg], filepath.Base(rel))
		if filepath.Base(rel) == "doc.go" {
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			t.docs[f.pkg] = string(src)
		}
		return nil
	})
	return t, err
}

func readFile(root, rel string) (file, error) {
	f := file{path: rel, pkg: filepath.ToSlash(filepath.Dir(rel)), test: strings.HasSuffix(rel, "_test.go")}
	src, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return f, err
	}
	sc := bufio.NewScanner(strings.NewReader(string(src)))
	sc.Buffer(nil, 1<<20)
	inHeader := true
	for sc.Scan() {
		f.lines++
		line := sc.Text()
		if strings.HasPrefix(line, "package ") {
			inHeader = false
		}
		if inHeader && generated.MatchString(line) {
			f.gen = true
		}
		if constraint.IsGoBuild(line) {
			if expr, err := constraint.Parse(line); err == nil {
				f.demo = expr.Eval(func(tag string) bool { return tag == "demo" }) &&
					!expr.Eval(func(string) bool { return false })
			}
		}
	}
	ast, err := parser.ParseFile(token.NewFileSet(), rel, src, parser.ImportsOnly)
	if err != nil {
		return f, err
	}
	for _, imp := range ast.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		f.imports = append(f.imports, path)
	}
	return f, nil
}

// generated is Go's marker of a generated file: its length is the
// generator's, not something to split by hand.
var generated = regexp.MustCompile(`^// Code generated .* DO NOT EDIT\.$`)

// floorOf returns the index of pkg's floor (0 is the top) and whether its
// floor is alone; -1 for a kit or a package with no floor.
func floorOf(pkg string) (int, bool) {
	for i, f := range floors {
		if slices.Contains(f.pkgs, pkg) {
			return i, f.alone
		}
	}
	return -1, false
}

// check returns every violation of the rules in t, one line each.
func (t *tree) check() []string {
	var bad []string
	report := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	pkgs := make([]string, 0, len(t.files))
	for p := range t.files {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	for _, pkg := range pkgs {
		floor, alone := floorOf(pkg)
		kit := slices.Contains(kits, pkg)
		if floor < 0 && !kit && pkg != "." {
			report("%s: package has no floor in internal/architecture/rules_test.go; place it there", pkg)
		}
		for _, f := range t.files[pkg] {
			if !f.test && !f.gen && f.lines > maxLines {
				report("%s: %d lines, over %d: split it by concept", f.path, f.lines, maxLines)
			}
			if f.test {
				continue
			}
			for _, imp := range f.imports {
				for _, d := range doors {
					if (imp == d.prefix || strings.HasPrefix(imp, d.prefix+"/")) && pkg != d.owner &&
						!slices.Contains(d.others, pkg) && !f.demo {
						report("%s: imports %s, which only %s may import", f.path, imp, d.owner)
					}
				}
				dep, ok := strings.CutPrefix(imp, t.module+"/")
				if !ok {
					continue
				}
				if slices.Contains(kits, dep) {
					if !kit && !f.demo {
						report("%s: imports the test kit %s", f.path, dep)
					}
					continue
				}
				if kit || floor < 0 {
					continue
				}
				to, _ := floorOf(dep)
				switch {
				case to < 0:
					// reported once for the package itself
				case to < floor:
					report("%s: imports %s, a floor up (%s → %s)", f.path, dep, floors[floor].name, floors[to].name)
				case to == floor && alone && dep != pkg:
					report("%s: imports %s; %s import none of each other", f.path, dep, floors[floor].name)
				}
			}
		}
		if doc, ok := t.docs[pkg]; ok {
			bad = append(bad, checkMap(pkg, doc, t.files[pkg])...)
		} else if pkg != "." {
			report("%s: no doc.go with a file map", pkg)
		}
	}
	return bad
}

// named finds the file names a doc.go mentions: words ending in .go (a
// generated x.pb.go too) that are not part of a path.
var named = regexp.MustCompile(`(?:^|[^\w/.-])([a-z0-9_]+(?:\.pb)?\.go)\b`)

// checkMap compares the files a doc.go names with the files of its folder:
// every non-test file but doc.go is named, and every name is a file there.
func checkMap(pkg, doc string, files []file) []string {
	var bad []string
	mentioned := map[string]bool{}
	for _, m := range named.FindAllStringSubmatch(doc, -1) {
		mentioned[m[1]] = true
	}
	here := map[string]bool{}
	for _, f := range files {
		name := filepath.Base(f.path)
		here[name] = true
		if !f.test && name != "doc.go" && !mentioned[name] {
			bad = append(bad, fmt.Sprintf("%s/doc.go: the file map does not name %s", pkg, name))
		}
	}
	for name := range mentioned {
		if !here[name] {
			bad = append(bad, fmt.Sprintf("%s/doc.go: names %s, which is not in the folder", pkg, name))
		}
	}
	slices.Sort(bad)
	return bad
}
