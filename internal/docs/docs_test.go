package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the repository, two levels up from this package.
var root = func() string {
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	return r
}()

// manuals are the documents whose links are checked.
func manuals(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md")
	}
	return append([]string{filepath.Join(root, "README.md"), filepath.Join(root, "CONTRIBUTING.md")}, docs...)
}

// prose returns the lines of a Markdown document outside fenced code
// blocks, with inline code spans blanked, each with its line number.
func prose(text string) (lines []string, numbers []int) {
	fenced := false
	for i, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		lines, numbers = append(lines, codeSpan.ReplaceAllString(l, "``")), append(numbers, i+1)
	}
	return lines, numbers
}

var codeSpan = regexp.MustCompile("`[^`]*`")

// heading is an ATX heading line: its level and text.
var heading = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)

// slug is the anchor GitHub gives a heading: lower case, punctuation
// dropped (but - and _), spaces as hyphens.
func slug(text string) string {
	text = strings.ReplaceAll(text, "`", "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// anchors returns the anchors of a document's headings, numbered as GitHub
// numbers repeated ones (x, x-1, x-2).
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		m := heading.FindStringSubmatch(l)
		if fenced || m == nil {
			continue
		}
		s := slug(m[2])
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// link is an inline Markdown link or image: [text](target "title").
var link = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// TestLinksResolve: every relative link of README.md, CONTRIBUTING.md and
// docs/*.md names a file or folder of the repository, and every #anchor a
// heading of the document it points into.
func TestLinksResolve(t *testing.T) {
	checked := 0
	for _, doc := range manuals(t) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(root, doc)
		lines, numbers := prose(string(b))
		for i, l := range lines {
			for _, m := range link.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				where := name + ":" + strconv.Itoa(numbers[i])
				path, anchor, _ := strings.Cut(target, "#")
				file := doc
				if path != "" {
					file = filepath.Join(filepath.Dir(doc), filepath.FromSlash(path))
					if rel, err := filepath.Rel(root, file); err != nil || strings.HasPrefix(rel, "..") {
						t.Errorf("%s: %s points outside the repository", where, target)
						continue
					}
					if _, err := os.Stat(file); err != nil {
						t.Errorf("%s: %s: no such file in the repository", where, target)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(file, ".md") {
					t.Errorf("%s: %s: an anchor into a file that is not Markdown", where, target)
					continue
				}
				tb, err := os.ReadFile(file)
				if err != nil {
					t.Errorf("%s: %s: %v", where, target, err)
					continue
				}
				if !anchors(string(tb))[anchor] {
					t.Errorf("%s: %s: no heading with the anchor #%s", where, target, anchor)
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d links, fewer than the manuals hold: the parsing misses some", checked)
	}
}

// mdName is a Markdown file name as text cites it.
var mdName = regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b`)

// outside are documents of the place sigwatch was written in, which a
// reader of the repository does not have, cited without their .md too.
var outside = []string{"/sha" + "red/", "PERF" + "-NOTES", "DESIGN" + ".md", "USERS" + ".md", "STYLE" + ".md", "ARCHITECTURE" + ".md"}

// TestNoCitationsOutsideRepository: no file of the tree (code, manuals,
// configs, bench/ and deploy/ included) cites a document the repository
// does not hold.
func TestNoCitationsOutsideRepository(t *testing.T) {
	have := map[string]bool{} // every .md of the tree, by path from the root and by name
	var texts []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (n == ".git" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if strings.HasSuffix(rel, ".md") {
			have[rel], have[filepath.Base(rel)] = true, true
		}
		switch filepath.Ext(rel) {
		case ".go", ".md", ".yaml", ".yml", ".sh", ".conf", ".service", ".json", ".html", ".js", ".css", ".mod":
		default:
			if n := filepath.Base(rel); n != "Makefile" && n != "Dockerfile" && n != "run" {
				return nil
			}
		}
		texts = append(texts, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range texts {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for n, l := range strings.Split(text, "\n") {
			where := rel + ":" + strconv.Itoa(n+1)
			for _, o := range outside {
				if strings.Contains(l, o) {
					t.Errorf("%s: cites %s, which is not in the repository", where, o)
				}
			}
			for _, m := range mdName.FindAllString(l, -1) {
				m = strings.TrimPrefix(strings.TrimPrefix(m, "./"), "../")
				if !have[m] && !have[filepath.Base(m)] && !slices.ContainsFunc(outside, func(o string) bool { return strings.Contains(m, strings.TrimSuffix(o, "/")) }) {
					t.Errorf("%s: cites %s, which is not in the repository", where, m)
				}
			}
		}
	}
	if len(texts) < 100 {
		t.Errorf("read %d files: the walk misses the tree", len(texts))
	}
}

// jargon are the words the glossary explains; the README keeps them out of
// everything a newcomer reads before the first walkthrough.
var jargon = []string{"watermark", "fence", "epoch", "generation", "crossing", "vetted"}

// TestReadmeIsAFrontDoor: README.md is at most 300 lines, opens with a
// contents list that names its sections in order, uses no word of the
// trade before "Your first real device", and that walkthrough is one
// shell block of at most 15 lines.
func TestReadmeIsAFrontDoor(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	all := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(all) > 300 {
		t.Errorf("README.md has %d lines, want at most 300: move detail into docs/", len(all))
	}

	lines, _ := prose(text)
	var sections []string
	var contents []string
	in := ""
	for _, l := range lines {
		if m := heading.FindStringSubmatch(l); m != nil {
			if len(m[1]) == 2 {
				in = m[2]
				if in != "Contents" {
					sections = append(sections, in)
				}
			}
			continue
		}
		if in == "Contents" && strings.HasPrefix(l, "- ") {
			contents = append(contents, l)
		}
	}
	if len(contents) == 0 {
		t.Fatal(`README.md has no "## Contents" list`)
	}
	entry := regexp.MustCompile(`^- \[(.+)\]\(#([^)]+)\)$`)
	var listed []string
	for _, c := range contents {
		m := entry.FindStringSubmatch(c)
		if m == nil {
			t.Errorf("contents entry %q is not - [Section](#anchor)", c)
			continue
		}
		if slug(m[1]) != m[2] {
			t.Errorf("contents entry %q: the anchor of %q is #%s", c, m[1], slug(m[1]))
		}
		listed = append(listed, m[1])
	}
	if !slices.Equal(listed, sections) {
		t.Errorf("contents list %q, want the sections in order: %q", listed, sections)
	}

	walk := strings.Index(text, "\n## Your first real device\n")
	if walk < 0 {
		t.Fatal(`README.md has no "## Your first real device"`)
	}
	for _, w := range jargon {
		if i := strings.Index(strings.ToLower(text[:walk]), w); i >= 0 {
			t.Errorf("README.md uses %q on line %d, before the walkthrough: say it plainly there, or later", w, strings.Count(text[:i], "\n")+1)
		}
	}
	rest := text[walk+1:]
	if next := strings.Index(rest[3:], "\n## "); next >= 0 {
		rest = rest[:next+3]
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(rest, -1)
	if len(blocks) != 1 {
		t.Fatalf("Your first real device has %d sh blocks, want 1", len(blocks))
	}
	if n := strings.Count(blocks[0][1], "\n"); n > 15 {
		t.Errorf("Your first real device's block has %d lines, want at most 15", n)
	}
}

// TestNoMergeMarkers: no text file of the tree keeps a conflict marker
// from a merge.
func TestNoMergeMarkers(t *testing.T) {
	markers := []string{"<<<<<<< ", "=======\n", ">>>>>>> "}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (n == ".git" || n == "node_modules" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(p) {
		case ".go", ".md", ".yaml", ".yml", ".js", ".html", ".css", ".sh", ".proto":
		default:
			if filepath.Base(p) != "Makefile" {
				return nil
			}
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for n, line := range strings.SplitAfter(string(b), "\n") {
			for _, m := range markers {
				if strings.HasPrefix(line, m) {
					rel, _ := filepath.Rel(root, p)
					t.Errorf("%s:%d: a merge's conflict marker %q", rel, n+1, strings.TrimSpace(m))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
