package parley_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeToolchain is a PATH holding the shell tools scripts/test.sh uses and
// a fake go and gofmt: go exits with goStatus (and prints nothing, so
// `go list -deps` finds no GPL package), gofmt prints nothing.
func fakeToolchain(t *testing.T, goStatus string) string {
	t.Helper()
	dir := t.TempDir()
	for _, tool := range []string{"bash", "awk", "mktemp", "tee", "sort", "rm", "sed", "grep", "cat", "dirname", "true"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s not found", tool)
		}
		if err := os.Symlink(p, filepath.Join(dir, tool)); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range map[string]string{
		"go":    "#!/bin/sh\nexit " + goStatus + "\n",
		"gofmt": "#!/bin/sh\nexit 0\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runTestScript runs scripts/test.sh with args under PATH path and only
// the variables in env.
func runTestScript(t *testing.T, path string, env []string, args ...string) (string, error) {
	t.Helper()
	bash := filepath.Join(path, "bash")
	cmd := exec.Command(bash, append([]string{"scripts/test.sh"}, args...)...)
	cmd.Env = append([]string{"PATH=" + path, "HOME=" + t.TempDir()}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestTestScriptSummary: scripts/test.sh ends with a summary of what ran
// and what was skipped on this machine (engine suites without their
// PARLEY_TEST_* variable, Autobahn without kosoku, the browser tests
// without Chromium, the alert rules without promtool), passed or failed;
// --summary prints it without running anything.
func TestTestScriptSummary(t *testing.T) {
	path := fakeToolchain(t, "0")
	out, err := runTestScript(t, path, []string{"PARLEY_TEST_REDIS=127.0.0.1:1"}, "--summary")
	if err != nil {
		t.Fatalf("--summary: %v\n%s", err, out)
	}
	for _, want := range []string{
		"ran      the suites on REDIS (PARLEY_TEST_REDIS=127.0.0.1:1)",
		"SKIPPED  the suites on NATS: PARLEY_TEST_NATS is unset",
		"SKIPPED  the suites on CASSANDRA: PARLEY_TEST_CASSANDRA is unset",
		"SKIPPED  the suites on S3: PARLEY_TEST_S3 is unset",
		"SKIPPED  the suites on OPENSEARCH: PARLEY_TEST_OPENSEARCH is unset",
		"SKIPPED  the Autobahn|Testsuite cases: PARLEY_KOSOKU is unset",
		"SKIPPED  the browser tests: no Chromium",
		"SKIPPED  the alert rules' checks: no promtool",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "step ") {
		t.Errorf("--summary ran steps:\n%s", out)
	}

	out, err = runTestScript(t, path, nil)
	if err != nil {
		t.Fatalf("a passing run: %v\n%s", err, out)
	}
	i := strings.Index(out, "== test summary")
	if i < 0 || !strings.HasSuffix(strings.TrimSpace(out), "== PASS") {
		t.Fatalf("a passing run ends without its summary:\n%s", out)
	}
	summary := out[i:]
	for _, want := range []string{"step     go vet ./...: passed", "step     gofmt -l: passed", "step     go test -race -count=1 -timeout 30m ./...: passed", "step     interop/libsignal", "SKIPPED  the suites on REDIS"} {
		if !strings.Contains(summary, want) {
			t.Errorf("the summary lacks %q:\n%s", want, summary)
		}
	}

	failing := fakeToolchain(t, "3")
	out, err = runTestScript(t, failing, nil)
	if err == nil || !strings.Contains(out, "== test summary") || !strings.Contains(out, "== FAIL (exit status 3)") || strings.Contains(out, "go vet ./...: passed") {
		t.Fatalf("a failing vet: err %v, output:\n%s", err, out)
	}
}
