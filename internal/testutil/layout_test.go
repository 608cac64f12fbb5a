package testutil

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The layout budgets of docs/ARCHITECTURE.md ("Layout budgets"): a
// function a reader can hold in their head, and a pkg/relay that only
// wires and supervises.
const (
	maxFuncLines  = 80
	maxRelayLines = 800
)

// goFiles lists the non-test Go files under dir (relative to the
// repository root).
func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	err = filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no Go files under %s", dir)
	}
	return out
}

func TestNoFunctionInPkgIsOver80Lines(t *testing.T) {
	fset := token.NewFileSet()
	for _, p := range goFiles(t, "pkg") {
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
			if n := end.Line - start.Line + 1; n > maxFuncLines {
				t.Errorf("%s:%d: %s is %d lines long (at most %d): split it by meaning", start.Filename, start.Line, fd.Name.Name, n, maxFuncLines)
			}
		}
	}
}

func TestRelayOnlyWires(t *testing.T) {
	total := 0
	for _, p := range goFiles(t, "pkg/relay") {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		total += strings.Count(string(b), "\n")
	}
	if total > maxRelayLines {
		t.Errorf("pkg/relay has %d lines of non-test code (at most %d): it wires and supervises; engines belong in their own packages", total, maxRelayLines)
	}
}

// Every package directory (pkg/*, internal/*, cmd/*, examples/*) is named,
// as `path`, in the README's development table and in docs/ARCHITECTURE.md.
func TestEveryPackageIsNamed(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var pkgs []string
	for _, top := range []string{"pkg", "internal", "cmd", "examples"} {
		entries, err := os.ReadDir(filepath.Join(root, top))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.IsDir() {
				pkgs = append(pkgs, top+"/"+e.Name())
			}
		}
	}
	for _, doc := range []string{"README.md", "docs/ARCHITECTURE.md"} {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkgs {
			if !strings.Contains(string(b), "`"+p+"`") {
				t.Errorf("%s does not name %s", doc, p)
			}
		}
	}
}
