package parley_test

import (
	"os"
	"testing"

	"golang.org/x/mod/modfile"
)

// TestGoInstallable: `go install github.com/parley-im/parley/cmd/parley@latest`
// builds the module as a dependency, which the go command refuses when
// its go.mod holds a replace or exclude directive; the patched nbio is
// therefore a package tree of this module, not a replaced module.
func TestGoInstallable(t *testing.T) {
	data, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.Module.Mod.Path != "github.com/parley-im/parley" {
		t.Errorf("module path %q", f.Module.Mod.Path)
	}
	for _, r := range f.Replace {
		t.Errorf("go.mod replaces %s: go install ...@latest would refuse the module", r.Old.Path)
	}
	for _, e := range f.Exclude {
		t.Errorf("go.mod excludes %s: go install ...@latest would refuse the module", e.Mod.Path)
	}
}
