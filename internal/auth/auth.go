// Package auth is the server's side of Parley's bearer tokens. Minting and
// verification live in the public package token (so an application's auth
// service uses the very code the server verifies with); this package
// re-exports them for the server's packages and adds the development key
// that an unconfigured server and `parley token` share.
package auth

import (
	"crypto/ed25519"

	"github.com/parley-im/parley/token"
)

// Aliases of the token package's types.
type (
	Config   = token.Config
	Identity = token.Identity
	Verifier = token.Verifier
	Claims   = token.Claims
)

// Sentinel errors (token.ErrExpired, token.ErrInvalid).
var (
	ErrExpired = token.ErrExpired
	ErrInvalid = token.ErrInvalid
)

// Limits and defaults of the token package.
const (
	DefaultLeeway    = token.DefaultLeeway
	MinHS256KeyBytes = token.MinHS256KeyBytes
)

// NewVerifier is token.NewVerifier.
func NewVerifier(cfg Config) (*Verifier, error) { return token.NewVerifier(cfg) }

// MintHS256 is token.MintHS256.
func MintHS256(key []byte, c Claims) (string, error) { return token.MintHS256(key, c) }

// MintEdDSA is token.MintEdDSA.
func MintEdDSA(key ed25519.PrivateKey, c Claims) (string, error) { return token.MintEdDSA(key, c) }

// ParseHS256Key is token.ParseHS256Key.
func ParseHS256Key(s string) ([]byte, error) { return token.ParseHS256Key(s) }

// LoadHS256KeyFile is token.LoadHS256KeyFile.
func LoadHS256KeyFile(path string) ([]byte, error) { return token.LoadHS256KeyFile(path) }

// ParseHS256Keys is token.ParseHS256Keys.
func ParseHS256Keys(s string) ([][]byte, error) { return token.ParseHS256Keys(s) }

// LoadHS256KeysFile is token.LoadHS256KeysFile.
func LoadHS256KeysFile(path string) ([][]byte, error) { return token.LoadHS256KeysFile(path) }

// LoadEd25519PublicKeysFile is token.LoadEd25519PublicKeysFile.
func LoadEd25519PublicKeysFile(path string) ([]ed25519.PublicKey, error) {
	return token.LoadEd25519PublicKeysFile(path)
}

// LoadEd25519PublicKeyFile is token.LoadEd25519PublicKeyFile.
func LoadEd25519PublicKeyFile(path string) (ed25519.PublicKey, error) {
	return token.LoadEd25519PublicKeyFile(path)
}

// ParseEd25519PublicKey is token.ParseEd25519PublicKey.
func ParseEd25519PublicKey(b []byte) (ed25519.PublicKey, error) {
	return token.ParseEd25519PublicKey(b)
}
