//go:build unix

package e2ee

import (
	"os"
	"path/filepath"
	"testing"
)

func checkModes(t *testing.T, dir string) {
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v %v", st.Mode(), err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v %v", f, st.Mode(), err)
		}
	}
}
