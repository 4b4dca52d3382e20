// Package testbin builds the real parley binary once per test package, for
// black-box tests that run it as child processes (crash and cluster tests),
// and beside it any other command of the module they run (parley-bench).
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

// Command is another command of the module for Main to build: cmd/Name,
// its path stored in *Path.
type Command struct {
	Name string
	Path *string
}

// Main builds parley and the commands of also into one temporary
// directory, stores parley's path in *binary, runs the package's tests and
// exits with their code; call it from TestMain.
func Main(m *testing.M, binary *string, also ...Command) {
	dir, err := os.MkdirTemp("", "parley-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, c := range append([]Command{{Name: "parley", Path: binary}}, also...) {
		*c.Path = filepath.Join(dir, c.Name)
		build := exec.Command("go", "build", "-o", *c.Path, "github.com/parley-im/parley/cmd/"+c.Name)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", c.Name, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
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
