package token

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/parley-im/parley/protocol"
)

// Claims is what Mint puts in a token.
type Claims struct {
	User   string // sub; must satisfy protocol.ValidID
	Device string // dev; empty = usable from any device of User
	// IssuedAt is iat; zero means now.
	IssuedAt time.Time
	// NotBefore is nbf; zero leaves the claim out.
	NotBefore time.Time
	// Expires is exp; it is required, since a token that never expires
	// cannot be revoked by waiting.
	Expires time.Time
}

func (c Claims) jwt() (claims, error) {
	if !protocol.ValidID(c.User) {
		return claims{}, fmt.Errorf("mint: user %q is not a valid id", c.User)
	}
	if c.Device != "" && !protocol.ValidID(c.Device) {
		return claims{}, fmt.Errorf("mint: device %q is not a valid id", c.Device)
	}
	if c.Expires.IsZero() {
		return claims{}, errors.New("mint: expiry is required")
	}
	iat := c.IssuedAt
	if iat.IsZero() {
		iat = time.Now()
	}
	out := claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   c.User,
			IssuedAt:  jwt.NewNumericDate(iat),
			ExpiresAt: jwt.NewNumericDate(c.Expires),
		},
		Device: c.Device,
	}
	if !c.NotBefore.IsZero() {
		out.NotBefore = jwt.NewNumericDate(c.NotBefore)
	}
	return out, nil
}

// MintHS256 signs c with a shared key.
func MintHS256(key []byte, c Claims) (string, error) {
	if len(key) < MinHS256KeyBytes {
		return "", fmt.Errorf("mint: hs256 key is %d bytes, need at least %d", len(key), MinHS256KeyBytes)
	}
	jc, err := c.jwt()
	if err != nil {
		return "", err
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jc).SignedString(key)
	if err != nil {
		return "", fmt.Errorf("mint: %w", err)
	}
	return s, nil
}

// MintEdDSA signs c with an Ed25519 private key.
func MintEdDSA(key ed25519.PrivateKey, c Claims) (string, error) {
	if len(key) != ed25519.PrivateKeySize {
		return "", fmt.Errorf("mint: ed25519 private key is %d bytes, want %d", len(key), ed25519.PrivateKeySize)
	}
	jc, err := c.jwt()
	if err != nil {
		return "", err
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jc).SignedString(key)
	if err != nil {
		return "", fmt.Errorf("mint: %w", err)
	}
	return s, nil
}
