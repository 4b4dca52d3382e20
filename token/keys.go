package token

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
)

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

// ParseHS256Keys decodes a key file's keys: one hex key per line, blank
// lines and lines starting with # ignored, at least one key. During a
// rotation a file holds the current key and the next (or the previous):
// the first is the one to sign with, every one verifies.
func ParseHS256Keys(s string) ([][]byte, error) {
	var keys [][]byte
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, err := ParseHS256Key(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, errors.New("parse hs256 key: no key")
	}
	return keys, nil
}

// LoadHS256KeyFile reads the first (signing) key of the HS256 key file at
// path (ParseHS256Keys).
func LoadHS256KeyFile(path string) ([]byte, error) {
	keys, err := LoadHS256KeysFile(path)
	if err != nil {
		return nil, err
	}
	return keys[0], nil
}

// LoadHS256KeysFile reads every key of the HS256 key file at path
// (ParseHS256Keys), the signing key first.
func LoadHS256KeysFile(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load hs256 key: %w", err)
	}
	keys, err := ParseHS256Keys(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return keys, nil
}

// LoadEd25519PublicKeyFile reads an Ed25519 public key from path, either as
// PEM "PUBLIC KEY" (PKIX, what `openssl pkey -pubout` writes) or as 64 hex
// characters; of a file with several (ParseEd25519PublicKeys), the first.
func LoadEd25519PublicKeyFile(path string) (ed25519.PublicKey, error) {
	keys, err := LoadEd25519PublicKeysFile(path)
	if err != nil {
		return nil, err
	}
	return keys[0], nil
}

// LoadEd25519PublicKeysFile reads every Ed25519 public key of the file at
// path (ParseEd25519PublicKeys).
func LoadEd25519PublicKeysFile(path string) ([]ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load ed25519 public key: %w", err)
	}
	keys, err := ParseEd25519PublicKeys(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return keys, nil
}

// ParseEd25519PublicKeys decodes a file of one or more Ed25519 public keys:
// PEM "PUBLIC KEY" blocks one after another, or hex keys one per line
// (blank lines and # comments ignored). During a rotation it holds the
// current key and the next: tokens signed by either verify.
func ParseEd25519PublicKeys(b []byte) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	if blk, rest := pem.Decode(b); blk != nil {
		for blk != nil {
			key, err := ParseEd25519PublicKey(pem.EncodeToMemory(blk))
			if err != nil {
				return nil, err
			}
			keys = append(keys, key)
			blk, rest = pem.Decode(rest)
		}
		if strings.TrimSpace(string(rest)) != "" {
			return nil, errors.New("parse ed25519 public key: text after the PEM blocks")
		}
		return keys, nil
	}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, err := ParseEd25519PublicKey([]byte(line))
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, errors.New("parse ed25519 public key: no key")
	}
	return keys, nil
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

// ParseEd25519PrivateKey decodes an Ed25519 private key for MintEdDSA: PEM
// "PRIVATE KEY" (PKCS #8, what `openssl genpkey -algorithm ed25519` writes),
// or hex of the 32-byte seed or of the 64-byte private key.
func ParseEd25519PrivateKey(b []byte) (ed25519.PrivateKey, error) {
	if blk, _ := pem.Decode(b); blk != nil {
		if blk.Type != "PRIVATE KEY" {
			return nil, fmt.Errorf("parse ed25519 private key: PEM block %q, want PRIVATE KEY", blk.Type)
		}
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse ed25519 private key: %w", err)
		}
		key, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("parse ed25519 private key: got %T", k)
		}
		return key, nil
	}
	raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, errors.New("parse ed25519 private key: neither PEM nor hex")
	}
	switch len(raw) {
	case ed25519.SeedSize:
		return ed25519.NewKeyFromSeed(raw), nil
	case ed25519.PrivateKeySize:
		key := ed25519.NewKeyFromSeed(raw[:ed25519.SeedSize])
		if !key.Public().(ed25519.PublicKey).Equal(ed25519.PublicKey(raw[ed25519.SeedSize:])) {
			return nil, errors.New("parse ed25519 private key: public half does not match the seed")
		}
		return key, nil
	}
	return nil, fmt.Errorf("parse ed25519 private key: %d bytes, want %d or %d", len(raw), ed25519.SeedSize, ed25519.PrivateKeySize)
}
