// Package parley_test holds the tests of the repository as a whole: rules
// every package of the module keeps, checked across the tree.
package parley_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestPackageDocs fails for every package of the module that carries no
// package doc comment: each package says what it owns and, where it has
// state, its concurrency contract (docs/architecture.md is only the map).
// The comment of a package with non-test files must be in one of those (go
// doc shows it); a directory of tests only (black-box suites) carries it in
// a test file. Mains under cmd/ and tools/ count; third_party, testdata,
// node_modules and nested modules (their own go.mod) do not.
func TestPackageDocs(t *testing.T) {
	type dir struct {
		name           string // the package of the non-test files, if any
		code, codeDoc  bool   // non-test files, one with a doc comment
		tests, testDoc bool   // the same for test files
	}
	dirs := map[string]*dir{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && skipDir(path, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		if ignored(f.Comments, f.Package) {
			return nil
		}
		dp := dirs[filepath.Dir(path)]
		if dp == nil {
			dp = &dir{}
			dirs[filepath.Dir(path)] = dp
		}
		doc := f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != ""
		if strings.HasSuffix(path, "_test.go") {
			dp.tests, dp.testDoc = true, dp.testDoc || doc
		} else {
			dp.name, dp.code, dp.codeDoc = f.Name.Name, true, dp.codeDoc || doc
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 10 {
		t.Fatalf("found %d packages: not run from the module root?", len(dirs))
	}
	var missing []string
	for path, d := range dirs {
		switch {
		case d.code && !d.codeDoc:
			missing = append(missing, "./"+filepath.ToSlash(path)+" (package "+d.name+")")
		case !d.code && d.tests && !d.testDoc:
			missing = append(missing, "./"+filepath.ToSlash(path)+" (tests only)")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("%s has no package doc comment: say what it owns and, if it has state, its concurrency contract", m)
	}
}

// skipDir reports the directories whose Go files are not this module's
// packages.
func skipDir(path, name string) bool {
	switch name {
	case "third_party", "testdata", "node_modules":
		return true
	}
	if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
		return true // the go tool ignores these too
	}
	_, err := os.Stat(filepath.Join(path, "go.mod"))
	return err == nil // a nested module
}

// ignored reports a file excluded from every build (//go:build ignore)
// before its package clause.
func ignored(comments []*ast.CommentGroup, pkgPos token.Pos) bool {
	for _, g := range comments {
		if g.Pos() > pkgPos {
			break
		}
		for _, c := range g.List {
			if strings.HasPrefix(c.Text, "//go:build") && strings.Contains(c.Text, "ignore") {
				return true
			}
		}
	}
	return false
}
