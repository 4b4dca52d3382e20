package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestServerLinksNoClientOrBenchCode: the server's binary serves and
// administers a node and nothing else. The Go client SDK and E2E code
// (client/...), the load tools (internal/bench, cmd/parley-bench) and the
// GPL interop code (go.mau.fi) are not in its dependency graph; key
// checks the server shares with clients come from protocol/e2ekeys.
func TestServerLinksNoClientOrBenchCode(t *testing.T) {
	const module = "github.com/parley-im/parley"
	out, err := exec.Command("go", "list", "-deps", module+"/cmd/parley").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 || !slices.Contains(deps, module+"/internal/server") {
		t.Fatalf("go list -deps lists %d packages without internal/server: not the server's graph", len(deps))
	}
	for _, p := range deps {
		switch {
		case p == module+"/client" || strings.HasPrefix(p, module+"/client/"):
			t.Errorf("the server links client code: %s", p)
		case p == module+"/internal/bench" || strings.HasPrefix(p, module+"/internal/bench/") || strings.HasPrefix(p, module+"/cmd/parley-"):
			t.Errorf("the server links benchmark or client command code: %s", p)
		case strings.HasPrefix(p, "go.mau.fi/"):
			t.Errorf("the server links GPL code: %s", p)
		}
	}
}
