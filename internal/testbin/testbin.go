// Package testbin builds the real parley binary once per test package, for
// black-box tests that run it as child processes (crash and cluster tests).
package testbin

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Main builds parley into a temporary directory, stores its path in
// *binary, runs the package's tests and exits with their code; call it
// from TestMain.
func Main(m *testing.M, binary *string) {
	dir, err := os.MkdirTemp("", "parley-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*binary = filepath.Join(dir, "parley")
	build := exec.Command("go", "build", "-o", *binary, "github.com/parley-im/parley/cmd/parley")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build parley:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Ready polls addr's /readyz until it answers 200 or within has passed,
// and reports whether it did.
func Ready(addr string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}
