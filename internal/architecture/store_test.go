package architecture

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// maxStoreMethods is the most exported methods shard.Store may have: the
// door stays small enough to read, and cohesive operations go behind a
// handle that one Store method returns.
const maxStoreMethods = 80

// TestStoreStaysSmall counts the exported methods of shard's *Store.
func TestStoreStaysSmall(t *testing.T) {
	ms, err := exportedMethods("../../shard", "Store")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 20 {
		t.Fatalf("found only %d methods of Store: %q", len(ms), ms)
	}
	if msg := storeTooBig(ms); msg != "" {
		t.Error(msg)
	}
}

// TestStoreCheckCatchesOneTooMany plants a Store with one method too many.
func TestStoreCheckCatchesOneTooMany(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("package shard\n\ntype Store struct{}\n\n")
	for i := range maxStoreMethods + 1 {
		fmt.Fprintf(&b, "func (s *Store) M%d() {}\n", i)
	}
	b.WriteString("func (s *Store) unexported() {}\n")
	for name, src := range map[string]string{
		"store.go":      b.String(),
		"store_test.go": "package shard\n\nfunc (s *Store) T() {}\n",
		"other.go":      "package shard\n\ntype Other struct{}\n\nfunc (o Other) N() {}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ms, err := exportedMethods(dir, "Store")
	if err != nil {
		t.Fatal(err)
	}
	want := "shard.Store has 81 exported methods, over 80"
	if msg := storeTooBig(ms); !strings.HasPrefix(msg, want) {
		t.Fatalf("got %q, want it to start %q", msg, want)
	}
	if msg := storeTooBig(ms[1:]); msg != "" {
		t.Fatalf("80 methods refused: %q", msg)
	}
}

// storeTooBig says why ms are too many exported methods for Store, or "".
func storeTooBig(ms []string) string {
	if len(ms) <= maxStoreMethods {
		return ""
	}
	return fmt.Sprintf("shard.Store has %d exported methods, over %d: group cohesive ones behind a "+
		"handle type returned by one Store method, as Watermarks, Timers and LostMarks do", len(ms), maxStoreMethods)
}

// exportedMethods returns, sorted, the exported methods declared on typ or
// *typ in the non-test .go files of dir.
func exportedMethods(dir, typ string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var out []string
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) != 1 || !fd.Name.IsExported() {
				continue
			}
			rt := fd.Recv.List[0].Type
			if st, ok := rt.(*ast.StarExpr); ok {
				rt = st.X
			}
			if id, ok := rt.(*ast.Ident); ok && id.Name == typ {
				out = append(out, fd.Name.Name)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}
