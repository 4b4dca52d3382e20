// Package e2ekeys is the public-key half of Parley's end-to-end
// encryption: a Curve25519 public key in libsignal's serialized form and
// the XEdDSA check of a signature made with it. It is what the server and
// the clients must agree on about keys — the server checks every prekey
// signature of a keys_upload with Verify, client/e2ee signs and verifies
// with the same code — and it holds no private keys and does no I/O.
//
// Values are plain arrays, safe to share between goroutines.
package e2ekeys

import (
	"crypto/sha512"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"

	"filippo.io/edwards25519"
	"filippo.io/edwards25519/field"
)

// DjbType is the type byte libsignal puts in front of a serialized
// Curve25519 public key.
const DjbType = 0x05

// PublicKey is a Curve25519 (X25519) public key: the Montgomery u
// coordinate, little endian.
type PublicKey [32]byte

// ErrBadKey: a serialized key is malformed. The text names the domain
// (end-to-end encryption), as client/e2ee's other errors do.
var ErrBadKey = errors.New("e2ee: malformed key")

// Bytes is libsignal's serialization: DjbType followed by the 32 bytes.
func (p PublicKey) Bytes() []byte {
	b := make([]byte, 33)
	b[0] = DjbType
	copy(b[1:], p[:])
	return b
}

// Equal compares in constant time.
func (p PublicKey) Equal(q PublicKey) bool {
	return subtle.ConstantTimeCompare(p[:], q[:]) == 1
}

// DecodePublicKey parses libsignal's 33-byte form (type byte 0x05).
func DecodePublicKey(b []byte) (PublicKey, error) {
	var p PublicKey
	if len(b) != 33 || b[0] != DjbType {
		return p, fmt.Errorf("%w: want 33 bytes starting with 0x05, got %d", ErrBadKey, len(b))
	}
	copy(p[:], b[1:])
	return p, nil
}

// Verify checks an XEdDSA signature (signal.org/docs/specifications/xeddsa)
// made by the owner of p, in libsignal's variant: the sign bit of the
// Edwards key's x coordinate travels in the top bit of the signature's
// last byte, where the verifier picks it up to lift the Montgomery key.
func (p PublicKey) Verify(msg, sig []byte) bool {
	if len(sig) != 64 {
		return false
	}
	// Lift u to the Edwards y = (u-1)/(u+1); u = -1 has no image.
	u, err := new(field.Element).SetBytes(p[:])
	if err != nil {
		return false
	}
	one := new(field.Element).One()
	den := new(field.Element).Add(u, one)
	if den.Equal(new(field.Element).Zero()) == 1 {
		return false
	}
	y := new(field.Element).Multiply(new(field.Element).Subtract(u, one), new(field.Element).Invert(den))
	enc := y.Bytes()
	enc[31] |= sig[63] & 0x80
	A, err := new(edwards25519.Point).SetBytes(enc)
	if err != nil {
		return false
	}
	var sb [64]byte
	copy(sb[:32], sig[32:])
	sb[31] &= 0x7F
	if sb[31]&0xE0 != 0 {
		return false
	}
	s, _ := edwards25519.NewScalar().SetUniformBytes(sb[:])

	h := sha512.New()
	h.Write(sig[:32])
	h.Write(A.Bytes())
	h.Write(msg)
	hs, _ := edwards25519.NewScalar().SetUniformBytes(h.Sum(nil))

	minusA := new(edwards25519.Point).Negate(A)
	check := new(edwards25519.Point).VarTimeDoubleScalarBaseMult(hs, minusA, s).Bytes()
	return subtle.ConstantTimeCompare(check, sig[:32]) == 1
}

// deviceCertContext opens every device certificate: a signature made with
// an account key for one purpose cannot be taken for another.
const deviceCertContext = "parley device certificate v1"

// DeviceCertMessage is what an account key signs to certify a device:
//
//	"parley device certificate v1" || 0x00 || u16be(len(user)) || user ||
//	u16be(len(device)) || device || identityKey
//
// identityKey is the device's serialized identity key (33 bytes, 0x05
// prefix). User and device ids are at most 64 bytes (protocol.ValidID), so
// the 16-bit lengths cannot overflow; longer ones are cut at 65535 bytes
// (VerifyDeviceCert refuses them).
func DeviceCertMessage(user, device string, identityKey []byte) []byte {
	user, device = clip16(user), clip16(device)
	b := make([]byte, 0, len(deviceCertContext)+1+2+len(user)+2+len(device)+len(identityKey))
	b = append(b, deviceCertContext...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(len(user)))
	b = append(b, user...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(device)))
	b = append(b, device...)
	return append(b, identityKey...)
}

func clip16(s string) string {
	if len(s) > 0xFFFF {
		return s[:0xFFFF]
	}
	return s
}

// VerifyDeviceCert reports whether sig is accountKey's (serialized, 33
// bytes) signature over the certificate of user/device with identityKey.
// A malformed account key or signature does not verify.
func VerifyDeviceCert(accountKey []byte, user, device string, identityKey, sig []byte) bool {
	ak, err := DecodePublicKey(accountKey)
	if err != nil || len(identityKey) != 33 || identityKey[0] != DjbType || len(user) > 0xFFFF || len(device) > 0xFFFF {
		return false
	}
	return ak.Verify(DeviceCertMessage(user, device, identityKey), sig)
}
