// Package privatefs wraps a Pebble filesystem so that everything the
// server creates on disk is private to the user it runs as: files 0600,
// directories 0700, whatever the umask, the mode of the directory they are
// created in, or its default ACLs. The store and the compensation ledger
// hold message bodies and who talks to whom; an operator-created 0755 data
// directory must not make them world-readable.
//
// Only the OS disk is changed; other filesystems (vfs.NewMem in tests)
// pass through. The wrapper adds no state and is safe for concurrent use
// as the wrapped FS is.
package privatefs

import (
	"fmt"
	"io"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// File and directory modes of what the server creates.
const (
	FileMode os.FileMode = 0o600
	DirMode  os.FileMode = 0o700
)

// Wrap returns fs with private modes on the OS disk; any other fs is
// returned as it is. nil means the OS disk.
func Wrap(fs vfs.FS) vfs.FS {
	if fs == nil {
		fs = vfs.Default
	}
	if fs != vfs.Default {
		return fs
	}
	return private{fs}
}

type private struct{ vfs.FS }

var _ vfs.FS = private{}

// chmod sets mode on a file just created. Pebble creates with 0666 and
// relies on the umask; setting the mode explicitly is what survives a
// permissive umask or a default ACL.
func chmod(name string, mode os.FileMode) error {
	if err := os.Chmod(name, mode); err != nil {
		return fmt.Errorf("privatefs: %w", err)
	}
	return nil
}

func (p private) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := p.FS.Create(name, c)
	return restrict(name, f, err)
}

func (p private) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := p.FS.OpenReadWrite(name, c, opts...)
	return restrict(name, f, err)
}

func (p private) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := p.FS.ReuseForWrite(oldname, newname, c)
	return restrict(newname, f, err)
}

func (p private) Lock(name string) (io.Closer, error) {
	l, err := p.FS.Lock(name)
	return restrict(name, l, err)
}

// restrict finishes an open of name that returned f, err: the file's
// mode becomes FileMode whatever the umask, or f is closed and the open
// fails.
func restrict[F io.Closer](name string, f F, err error) (F, error) {
	var none F
	if err != nil {
		return none, err
	}
	if err := chmod(name, FileMode); err != nil {
		_ = f.Close()
		return none, err
	}
	return f, nil
}

// MkdirAll creates missing directories 0700. Directories that exist keep
// their mode: the data directory itself is the operator's.
func (p private) MkdirAll(dir string, _ os.FileMode) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := p.FS.MkdirAll(dir, DirMode); err != nil {
		return err
	}
	return chmod(dir, DirMode)
}
