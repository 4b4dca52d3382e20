package auth

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// DevKeyFile is the name of the development HS256 key inside the data
// directory.
const DevKeyFile = "dev-hs256.key"

// LoadOrCreateDevKey returns the development HS256 key in dir/DevKeyFile,
// creating it (32 random bytes, hex, mode 0600) on first use. It exists so
// that `parley serve` and `parley token` agree on a key with no setup; a
// production deployment configures its own key instead.
//
// Two processes starting together on a fresh dir both end up with the key
// that was linked into place first: the file appears atomically, complete.
func LoadOrCreateDevKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, DevKeyFile)
	key, err := LoadHS256KeyFile(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create dev key: %w", err)
	}
	if err := createDevKey(dir, path); err != nil {
		return nil, err
	}
	return LoadHS256KeyFile(path)
}

func createDevKey(dir, path string) error {
	key := make([]byte, MinHS256KeyBytes)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("create dev key: %w", err)
	}
	tmp, err := os.CreateTemp(dir, DevKeyFile+".tmp*")
	if err != nil {
		return fmt.Errorf("create dev key: %w", err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp already made the file 0600.
	_, werr := tmp.WriteString(hex.EncodeToString(key) + "\n")
	if err := errors.Join(werr, tmp.Sync(), tmp.Close()); err != nil {
		return fmt.Errorf("create dev key: %w", err)
	}
	// Link, unlike rename, fails when the target exists, so a key another
	// process already handed out is never replaced.
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create dev key: %w", err)
	}
	return nil
}
