package privatefs

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	cpebble "github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestPebbleFilesArePrivate opens a real Pebble database under a 0755
// directory with a permissive umask: every file it writes is 0600 and every
// directory it creates 0700.
func TestPebbleFilesArePrivate(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "store")
	db, err := cpebble.Open(dir, &cpebble.Options{FS: Wrap(nil)})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if err := db.Set([]byte{byte(i)}, make([]byte, 1024), cpebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	files := 0
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		want := FileMode
		if d.IsDir() {
			want = DirMode
		} else {
			files++
		}
		if got := info.Mode().Perm(); got != want {
			t.Errorf("%s: mode %v, want %v", p, got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 3 {
		t.Fatalf("only %d files written", files)
	}
	if info, _ := os.Stat(root); info.Mode().Perm() != 0o755 {
		t.Errorf("the operator's directory changed mode to %v", info.Mode().Perm())
	}
}

func TestOtherFilesystemsPassThrough(t *testing.T) {
	mem := vfs.NewMem()
	if got := Wrap(mem); got != mem {
		t.Fatalf("Wrap(mem) = %T, want the mem FS itself", got)
	}
}
