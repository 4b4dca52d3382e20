package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// DevKeyFile is the name of the development HS256 key inside the data
// directory.
const DevKeyFile = "dev-hs256.key"

// ParseHS256Key decodes a hex-encoded HS256 key, ignoring surrounding
// whitespace so that files ending in a newline work.
func ParseHS256Key(s string) ([]byte, error) {
	key, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("parse hs256 key: not hex: %w", err)
	}
	if len(key) < MinHS256KeyBytes {
		return nil, fmt.Errorf("parse hs256 key: %d bytes, need at least %d", len(key), MinHS256KeyBytes)
	}
	return key, nil
}

// LoadHS256KeyFile reads a hex-encoded HS256 key from path.
func LoadHS256KeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load hs256 key: %w", err)
	}
	key, err := ParseHS256Key(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return key, nil
}

// LoadEd25519PublicKeyFile reads an Ed25519 public key from path, either as
// PEM "PUBLIC KEY" (PKIX, what `openssl pkey -pubout` writes) or as 64 hex
// characters.
func LoadEd25519PublicKeyFile(path string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load ed25519 public key: %w", err)
	}
	key, err := ParseEd25519PublicKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return key, nil
}

// ParseEd25519PublicKey decodes a PEM PKIX or hex Ed25519 public key.
func ParseEd25519PublicKey(b []byte) (ed25519.PublicKey, error) {
	if blk, _ := pem.Decode(b); blk != nil {
		if blk.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("parse ed25519 public key: PEM block %q, want PUBLIC KEY", blk.Type)
		}
		pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse ed25519 public key: %w", err)
		}
		key, ok := pub.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("parse ed25519 public key: got %T", pub)
		}
		return key, nil
	}
	raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, errors.New("parse ed25519 public key: neither PEM nor hex")
	}
	if len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("parse ed25519 public key: %d bytes, want %d", len(raw), ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(raw), nil
}

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
