package e2ee

import (
	"crypto/rand"
	"crypto/sha512"

	"filippo.io/edwards25519"
)

// XEdDSA (signal.org/docs/specifications/xeddsa) lets an X25519 identity
// key sign. This is libsignal's variant: the Edwards public key is derived
// from the clamped scalar as is (no negation) and the sign bit of its x
// coordinate travels in the top bit of the signature's last byte, where
// the verifier picks it up to lift the Montgomery key. Verify is
// PublicKey's method, in protocol/e2ekeys.

var xeddsaPrefix = [32]byte{0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
	0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}

// Sign makes a 64-byte XEdDSA signature of msg with k, using 64 fresh
// random bytes.
func (k PrivateKey) Sign(msg []byte) [64]byte {
	var z [64]byte
	if _, err := rand.Read(z[:]); err != nil {
		panic("e2ee: crypto/rand failed: " + err.Error())
	}
	return k.signWith(msg, z)
}

func (k PrivateKey) signWith(msg []byte, z [64]byte) [64]byte {
	a, err := edwards25519.NewScalar().SetBytesWithClamping(k[:])
	if err != nil {
		panic("e2ee: scalar: " + err.Error())
	}
	A := new(edwards25519.Point).ScalarBaseMult(a).Bytes()
	signBit := A[31] & 0x80

	h := sha512.New()
	h.Write(xeddsaPrefix[:])
	h.Write(k[:])
	h.Write(msg)
	h.Write(z[:])
	r, _ := edwards25519.NewScalar().SetUniformBytes(h.Sum(nil))
	R := new(edwards25519.Point).ScalarBaseMult(r).Bytes()

	h.Reset()
	h.Write(R)
	h.Write(A)
	h.Write(msg)
	hs, _ := edwards25519.NewScalar().SetUniformBytes(h.Sum(nil))
	s := edwards25519.NewScalar().MultiplyAdd(hs, a, r)

	var sig [64]byte
	copy(sig[:32], R)
	copy(sig[32:], s.Bytes())
	sig[63] = sig[63]&0x7F | signBit
	return sig
}
