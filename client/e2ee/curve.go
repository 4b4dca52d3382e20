package e2ee

import (
	"crypto/ecdh"
	"crypto/rand"
	"errors"

	"github.com/parley-im/parley/protocol/e2ekeys"
)

// DjbType is the type byte libsignal puts in front of a serialized
// Curve25519 public key.
const DjbType = e2ekeys.DjbType

// PublicKey is a Curve25519 (X25519) public key: the Montgomery u
// coordinate, little endian. It is protocol/e2ekeys' type, the one the
// server checks signatures with.
type PublicKey = e2ekeys.PublicKey

// PrivateKey is a clamped X25519 scalar.
type PrivateKey [32]byte

// KeyPair is an X25519 key pair.
type KeyPair struct {
	Private PrivateKey `json:"priv"`
	Public  PublicKey  `json:"pub"`
}

// Errors of key handling.
var (
	ErrBadKey       = e2ekeys.ErrBadKey
	ErrLowOrderKey  = errors.New("e2ee: low-order or invalid public key")
	ErrBadSignature = errors.New("e2ee: bad signature")
)

func clamp(k *[32]byte) {
	k[0] &= 248
	k[31] &= 127
	k[31] |= 64
}

// GenerateKeyPair makes a fresh X25519 key pair from crypto/rand.
func GenerateKeyPair() KeyPair {
	var k PrivateKey
	if _, err := rand.Read(k[:]); err != nil {
		panic("e2ee: crypto/rand failed: " + err.Error())
	}
	return NewKeyPair(k)
}

// NewKeyPair derives the key pair of a private key (clamped first, as
// libsignal does).
func NewKeyPair(priv PrivateKey) KeyPair {
	clamp((*[32]byte)(&priv))
	return KeyPair{Private: priv, Public: priv.Public()}
}

// Public returns the X25519 public key of k.
func (k PrivateKey) Public() PublicKey {
	sk, err := ecdh.X25519().NewPrivateKey(k[:])
	if err != nil {
		panic("e2ee: x25519 private key: " + err.Error())
	}
	var p PublicKey
	copy(p[:], sk.PublicKey().Bytes())
	return p
}

// Agree computes X25519(k, pub). A low-order public key (all-zero output)
// is refused with ErrLowOrderKey.
func (k PrivateKey) Agree(pub PublicKey) ([32]byte, error) {
	var out [32]byte
	sk, err := ecdh.X25519().NewPrivateKey(k[:])
	if err != nil {
		return out, ErrBadKey
	}
	pk, err := ecdh.X25519().NewPublicKey(pub[:])
	if err != nil {
		return out, ErrBadKey
	}
	s, err := sk.ECDH(pk)
	if err != nil {
		return out, ErrLowOrderKey
	}
	copy(out[:], s)
	return out, nil
}

// DecodePublicKey parses libsignal's 33-byte form (type byte 0x05).
func DecodePublicKey(b []byte) (PublicKey, error) {
	return e2ekeys.DecodePublicKey(b)
}
