package e2ee

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/gofrs/flock"
)

// Store keeps a device's secret state: its identity, prekeys, sessions and
// sender keys, as opaque values under keys like "session/bob/phone".
// Implementations must be safe for concurrent use; a Device serialises its
// own read-modify-write cycles.
type Store interface {
	// Load returns the value of key, or (nil, nil) if there is none.
	Load(key string) ([]byte, error)
	// Save stores value under key durably.
	Save(key string, value []byte) error
	// Delete removes key (no error if absent).
	Delete(key string) error
	// List returns the keys starting with prefix, sorted.
	List(prefix string) ([]string, error)
}

// ErrLocked is returned by OpenFileStore when another process (or another
// FileStore in this one) holds the directory: two users of one device's
// keys would encrypt with the same message keys and overwrite each other's
// ratchets.
var ErrLocked = errors.New("e2ee: key directory in use by another process")

// errClosed is returned by a FileStore used after Close: without the lock
// its writes could race another process's.
var errClosed = errors.New("e2ee: file store closed")

// lockName is the lock file in a FileStore's directory (no key's file
// starts with '.', see path).
const lockName = ".lock"

// FileStore is the default Store: one file per key in a directory, mode
// 0600 (the directory 0700), each write atomic and durable (temporary file,
// fsync, rename, fsync of the directory). The directory is locked for the
// FileStore's life (an exclusive lock on its .lock file, released by Close
// or by the process's exit), so one process at a time uses a device's keys.
type FileStore struct {
	dir  string
	lock *flock.Flock
	// syncFile is (*os.File).Sync; tests replace it to watch the order of
	// the writes.
	syncFile func(*os.File) error

	mu     sync.RWMutex // held for reading by operations, for writing by Close
	closed bool
}

// OpenFileStore opens (creating) a store in dir and locks it: a directory
// another FileStore holds, in this process or another, is ErrLocked. Close
// releases it. Temporary files a crash left behind are removed.
func OpenFileStore(dir string) (*FileStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	lock := flock.New(filepath.Join(dir, lockName), flock.SetPermissions(0o600))
	ok, err := lock.TryLock()
	if err != nil {
		return nil, fmt.Errorf("e2ee: file store: lock %s: %w", dir, err)
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrLocked, dir)
	}
	f := &FileStore{dir: dir, lock: lock, syncFile: (*os.File).Sync}
	if err := f.removeTemps(); err != nil {
		lock.Close()
		return nil, err
	}
	return f, nil
}

// removeTemps deletes the temporary files of writes a crash interrupted
// (safe under the lock: no other writer can own them).
func (f *FileStore) removeTemps() error {
	tmps, err := filepath.Glob(filepath.Join(f.dir, ".tmp-*"))
	if err != nil {
		return err
	}
	for _, t := range tmps {
		if err := os.Remove(t); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Close releases the directory's lock; the FileStore is unusable after.
// Closing twice is harmless.
func (f *FileStore) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	return f.lock.Close()
}

// use takes the read side of f.mu for an operation, failing after Close.
func (f *FileStore) use() (func(), error) {
	f.mu.RLock()
	if f.closed {
		f.mu.RUnlock()
		return nil, errClosed
	}
	return f.mu.RUnlock, nil
}

// path is key's file: path-escaped, with a leading '.' escaped too, so no
// key names the lock or a temporary file.
func (f *FileStore) path(key string) string {
	name := url.PathEscape(key)
	if strings.HasPrefix(name, ".") {
		name = "%2E" + name[1:]
	}
	return filepath.Join(f.dir, name)
}

func (f *FileStore) Load(key string) ([]byte, error) {
	done, err := f.use()
	if err != nil {
		return nil, err
	}
	defer done()
	b, err := os.ReadFile(f.path(key))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// Save writes value to a temporary file, fsyncs it, renames it over the
// key's file and fsyncs the directory: after a crash the key holds the old
// value or the new one, and once Save returns, the new one (a consumed
// prekey's deletion or a ratchet step that came back would let a message
// be decrypted twice).
func (f *FileStore) Save(key string, value []byte) error {
	done, err := f.use()
	if err != nil {
		return err
	}
	defer done()
	tmp, err := os.CreateTemp(f.dir, ".tmp-*")
	if err != nil {
		return err
	}
	name := tmp.Name()
	defer os.Remove(name)
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(value); err != nil {
		tmp.Close()
		return err
	}
	if err := f.syncFile(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(name, f.path(key)); err != nil {
		return err
	}
	return f.syncDir()
}

// syncDir makes the directory's entries (renames, removals) durable. On
// Windows a directory handle cannot be flushed (FlushFileBuffers needs
// write access) and NTFS journals the rename itself, so there is nothing
// to do.
func (f *FileStore) syncDir() error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(f.dir)
	if err != nil {
		return err
	}
	err = f.syncFile(d)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("e2ee: file store: sync %s: %w", f.dir, err)
	}
	return nil
}

// Delete removes key's file and fsyncs the directory, so that a consumed
// key stays deleted after a crash.
func (f *FileStore) Delete(key string) error {
	done, err := f.use()
	if err != nil {
		return err
	}
	defer done()
	err = os.Remove(f.path(key))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.syncDir()
}

func (f *FileStore) List(prefix string) ([]string, error) {
	done, err := f.use()
	if err != nil {
		return nil, err
	}
	defer done()
	ents, err := os.ReadDir(f.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") || e.Name() == lockName {
			continue
		}
		k, err := url.PathUnescape(e.Name())
		if err != nil {
			return nil, fmt.Errorf("e2ee: file store: stray file %q", e.Name())
		}
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out, nil
}

// MemoryStore is a Store in memory (tests, throwaway devices).
type MemoryStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{m: map[string][]byte{}} }

func (s *MemoryStore) Load(key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[key]
	if !ok {
		return nil, nil
	}
	return append([]byte(nil), v...), nil
}

func (s *MemoryStore) Save(key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = append([]byte(nil), value...)
	return nil
}

func (s *MemoryStore) Delete(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
	return nil
}

func (s *MemoryStore) List(prefix string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.m {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Snapshot copies every value (tests use it to model an attacker who
// copied a device's state).
func (s *MemoryStore) Snapshot() *MemoryStore {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := NewMemoryStore()
	for k, v := range s.m {
		c.m[k] = append([]byte(nil), v...)
	}
	return c
}
