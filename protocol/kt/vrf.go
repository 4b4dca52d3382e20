package kt

import (
	"crypto/rand"
	"crypto/sha512"
	"crypto/subtle"
	"errors"
	"fmt"

	"filippo.io/edwards25519"
)

// The VRF is RFC 9381 ECVRF-EDWARDS25519-SHA512-TAI (suite 0x03): keys as
// in Ed25519 (RFC 8032 section 5.1.5), hash to curve by try-and-increment,
// nonces as in RFC 8032, 16-byte challenges. Points and scalars decode
// strictly (RFC 8032 section 5.1.3: no non-canonical encodings), and a
// public key of small order is refused (validate_key).
const (
	VRFSeedSize   = 32 // a private key is a 32-byte seed, as in Ed25519
	VRFPublicSize = 32 // an encoded edwards25519 point
	VRFProofSize  = 80 // Gamma (32) || c (16) || s (32)
	VRFOutputSize = 64 // beta, a SHA-512 output

	suiteString = 0x03
	cLen        = 16
)

// labelPrefix is the domain of the VRF input that hides a user id behind
// its label (alpha = labelPrefix || user).
const labelPrefix = "parley kt v1\x00"

// VRFPrivateKey is a VRF key. It is immutable after creation and safe to
// share between goroutines.
type VRFPrivateKey struct {
	seed     [VRFSeedSize]byte
	x        *edwards25519.Scalar // the secret scalar
	nonceKey [32]byte             // SHA-512(seed)[32:], the nonce key of RFC 8032
	pub      VRFPublicKey
}

// VRFPublicKey is an encoded edwards25519 point, the VRF's public key.
type VRFPublicKey [VRFPublicSize]byte

// GenerateVRFKey returns a fresh VRF key from crypto/rand.
func GenerateVRFKey() (*VRFPrivateKey, error) {
	var seed [VRFSeedSize]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("kt: vrf key: %w", err)
	}
	return NewVRFPrivateKey(seed[:])
}

// NewVRFPrivateKey derives the VRF key of a 32-byte seed (what Seed
// returns; the server stores it).
func NewVRFPrivateKey(seed []byte) (*VRFPrivateKey, error) {
	if len(seed) != VRFSeedSize {
		return nil, fmt.Errorf("kt: vrf seed of %d bytes, want %d", len(seed), VRFSeedSize)
	}
	k := &VRFPrivateKey{}
	copy(k.seed[:], seed)
	h := sha512.Sum512(seed)
	x, err := edwards25519.NewScalar().SetBytesWithClamping(h[:32])
	if err != nil {
		return nil, fmt.Errorf("kt: vrf key: %w", err)
	}
	k.x = x
	copy(k.nonceKey[:], h[32:])
	copy(k.pub[:], new(edwards25519.Point).ScalarBaseMult(x).Bytes())
	return k, nil
}

// Seed returns the key's 32-byte seed.
func (k *VRFPrivateKey) Seed() []byte { return append([]byte(nil), k.seed[:]...) }

// Public returns the key's public half.
func (k *VRFPrivateKey) Public() VRFPublicKey { return k.pub }

// Prove returns the VRF output beta of alpha and the proof that beta is the
// output for this key (ECVRF_prove and ECVRF_proof_to_hash).
func (k *VRFPrivateKey) Prove(alpha []byte) (beta [VRFOutputSize]byte, proof []byte) {
	h, err := encodeToCurve(k.pub[:], alpha)
	if err != nil {
		// 256 failed tries happen with probability 2^-256.
		panic(err)
	}
	hs := h.Bytes()
	gamma := new(edwards25519.Point).ScalarMult(k.x, h)
	kn := nonce(k.nonceKey[:], hs)
	u := new(edwards25519.Point).ScalarBaseMult(kn)
	v := new(edwards25519.Point).ScalarMult(kn, h)
	c := challenge(k.pub[:], hs, gamma.Bytes(), u.Bytes(), v.Bytes())
	cs := challengeScalar(c)
	s := edwards25519.NewScalar().MultiplyAdd(cs, k.x, kn)

	proof = make([]byte, 0, VRFProofSize)
	proof = append(proof, gamma.Bytes()...)
	proof = append(proof, c[:]...)
	proof = append(proof, s.Bytes()...)
	return proofToHash(gamma), proof
}

// ErrVRF: a VRF proof or public key does not verify.
var ErrVRF = errors.New("kt: vrf proof does not verify")

// Verify checks proof for alpha under pk and returns the VRF output
// (ECVRF_verify with validate_key). Any failure is ErrVRF.
func (pk VRFPublicKey) Verify(alpha, proof []byte) (beta [VRFOutputSize]byte, err error) {
	if len(proof) != VRFProofSize {
		return beta, fmt.Errorf("%w: proof of %d bytes", ErrVRF, len(proof))
	}
	y, err := decodePoint(pk[:])
	if err != nil {
		return beta, fmt.Errorf("%w: public key: %v", ErrVRF, err)
	}
	if new(edwards25519.Point).MultByCofactor(y).Equal(edwards25519.NewIdentityPoint()) == 1 {
		return beta, fmt.Errorf("%w: public key of small order", ErrVRF)
	}
	gamma, err := decodePoint(proof[:32])
	if err != nil {
		return beta, fmt.Errorf("%w: gamma: %v", ErrVRF, err)
	}
	var c [cLen]byte
	copy(c[:], proof[32:32+cLen])
	s, err := edwards25519.NewScalar().SetCanonicalBytes(proof[32+cLen:])
	if err != nil {
		return beta, fmt.Errorf("%w: s: %v", ErrVRF, err)
	}
	h, err := encodeToCurve(pk[:], alpha)
	if err != nil {
		return beta, fmt.Errorf("%w: %v", ErrVRF, err)
	}
	negC := edwards25519.NewScalar().Negate(challengeScalar(c))
	// U = s*B - c*Y, V = s*H - c*Gamma
	u := new(edwards25519.Point).VarTimeDoubleScalarBaseMult(negC, y, s)
	v := new(edwards25519.Point).VarTimeMultiScalarMult(
		[]*edwards25519.Scalar{s, negC}, []*edwards25519.Point{h, gamma})
	want := challenge(pk[:], h.Bytes(), gamma.Bytes(), u.Bytes(), v.Bytes())
	if subtle.ConstantTimeCompare(want[:], c[:]) != 1 {
		return beta, ErrVRF
	}
	return proofToHash(gamma), nil
}

// Label is the log label of a VRF output: its first 32 bytes.
func Label(beta [VRFOutputSize]byte) [32]byte {
	var l [32]byte
	copy(l[:], beta[:32])
	return l
}

// LabelInput is the VRF input of a user's label.
func LabelInput(user string) []byte {
	return append([]byte(labelPrefix), user...)
}

// LabelFor returns user's label under k and the VRF proof a client checks
// it with (VerifyLabel).
func LabelFor(k *VRFPrivateKey, user string) ([32]byte, []byte) {
	beta, proof := k.Prove(LabelInput(user))
	return Label(beta), proof
}

// VerifyLabel checks the VRF proof of user's label under pk and returns the
// label; any failure is ErrVRF.
func (pk VRFPublicKey) VerifyLabel(user string, proof []byte) ([32]byte, error) {
	beta, err := pk.Verify(LabelInput(user), proof)
	if err != nil {
		return [32]byte{}, err
	}
	return Label(beta), nil
}

// encodeToCurve is ECVRF_encode_to_curve_try_and_increment with the public
// key as the salt.
func encodeToCurve(salt, alpha []byte) (*edwards25519.Point, error) {
	for ctr := 0; ctr < 256; ctr++ {
		hh := sha512.New()
		hh.Write([]byte{suiteString, 0x01})
		hh.Write(salt)
		hh.Write(alpha)
		hh.Write([]byte{byte(ctr), 0x00})
		sum := hh.Sum(nil)
		p, err := decodePoint(sum[:32])
		if err != nil {
			continue
		}
		return p.MultByCofactor(p), nil
	}
	return nil, errors.New("kt: vrf: no curve point after 256 tries")
}

// decodePoint is RFC 8032's strict decoding: edwards25519.Point.SetBytes
// accepts non-canonical encodings (y >= p, or x = 0 with the sign bit set),
// which string_to_point must refuse.
func decodePoint(b []byte) (*edwards25519.Point, error) {
	p, err := new(edwards25519.Point).SetBytes(b)
	if err != nil {
		return nil, err
	}
	if subtle.ConstantTimeCompare(p.Bytes(), b) != 1 {
		return nil, errors.New("non-canonical point encoding")
	}
	return p, nil
}

// nonce is ECVRF_nonce_generation_RFC8032.
func nonce(nonceKey, hs []byte) *edwards25519.Scalar {
	hh := sha512.New()
	hh.Write(nonceKey)
	hh.Write(hs)
	k, err := edwards25519.NewScalar().SetUniformBytes(hh.Sum(nil))
	if err != nil {
		panic(err) // a SHA-512 output is always 64 bytes
	}
	return k
}

// challenge is ECVRF_challenge_generation over encoded points.
func challenge(points ...[]byte) [cLen]byte {
	hh := sha512.New()
	hh.Write([]byte{suiteString, 0x02})
	for _, p := range points {
		hh.Write(p)
	}
	hh.Write([]byte{0x00})
	var c [cLen]byte
	copy(c[:], hh.Sum(nil))
	return c
}

// challengeScalar reads a 16-byte little-endian challenge as a scalar
// (always canonical: below 2^128).
func challengeScalar(c [cLen]byte) *edwards25519.Scalar {
	var b [32]byte
	copy(b[:], c[:])
	s, err := edwards25519.NewScalar().SetCanonicalBytes(b[:])
	if err != nil {
		panic(err)
	}
	return s
}

// proofToHash is ECVRF_proof_to_hash.
func proofToHash(gamma *edwards25519.Point) [VRFOutputSize]byte {
	hh := sha512.New()
	hh.Write([]byte{suiteString, 0x03})
	hh.Write(new(edwards25519.Point).MultByCofactor(gamma).Bytes())
	hh.Write([]byte{0x00})
	var beta [VRFOutputSize]byte
	copy(beta[:], hh.Sum(nil))
	return beta
}
