package e2ee

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
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

// FileStore is the default Store: one file per key in a directory, mode
// 0600 (the directory 0700), each write atomic (temporary file, fsync,
// rename).
type FileStore struct {
	dir string
}

// OpenFileStore opens (creating) a store in dir.
func OpenFileStore(dir string) (*FileStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	return &FileStore{dir: dir}, nil
}

func (f *FileStore) path(key string) string {
	return filepath.Join(f.dir, url.PathEscape(key))
}

func (f *FileStore) Load(key string) ([]byte, error) {
	b, err := os.ReadFile(f.path(key))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

func (f *FileStore) Save(key string, value []byte) error {
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
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(name, f.path(key))
}

func (f *FileStore) Delete(key string) error {
	err := os.Remove(f.path(key))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

func (f *FileStore) List(prefix string) ([]string, error) {
	ents, err := os.ReadDir(f.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
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
