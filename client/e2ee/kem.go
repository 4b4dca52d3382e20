package e2ee

import (
	"crypto/mlkem"
	"fmt"
)

// KEMType is libsignal's type byte for ML-KEM-1024 keys and ciphertexts.
const KEMType = 0x0A

// KEMKeyPair is an ML-KEM-1024 key pair, kept as its 64-byte seed.
type KEMKeyPair struct {
	Seed   []byte `json:"seed"`
	Public []byte `json:"pub"` // serialized: KEMType || encapsulation key
}

// GenerateKEMKeyPair makes a fresh ML-KEM-1024 key pair.
func GenerateKEMKeyPair() KEMKeyPair {
	dk, err := mlkem.GenerateKey1024()
	if err != nil {
		panic("e2ee: mlkem: " + err.Error())
	}
	return KEMKeyPair{Seed: dk.Bytes(), Public: append([]byte{KEMType}, dk.EncapsulationKey().Bytes()...)}
}

// kemEncapsulate encapsulates to a serialized public key and returns the
// shared secret and the serialized ciphertext (KEMType || ciphertext).
func kemEncapsulate(pub []byte) (ss, ct []byte, err error) {
	if len(pub) != 1+mlkem.EncapsulationKeySize1024 || pub[0] != KEMType {
		return nil, nil, fmt.Errorf("%w: ML-KEM-1024 public key of %d bytes", ErrBadKey, len(pub))
	}
	ek, err := mlkem.NewEncapsulationKey1024(pub[1:])
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrBadKey, err)
	}
	ss, c := ek.Encapsulate()
	return ss, append([]byte{KEMType}, c...), nil
}

// decapsulate recovers the shared secret of a serialized ciphertext.
func (k KEMKeyPair) decapsulate(ct []byte) ([]byte, error) {
	if len(ct) != 1+mlkem.CiphertextSize1024 || ct[0] != KEMType {
		return nil, fmt.Errorf("%w: ML-KEM-1024 ciphertext of %d bytes", ErrBadKey, len(ct))
	}
	dk, err := mlkem.NewDecapsulationKey1024(k.Seed)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadKey, err)
	}
	return dk.Decapsulate(ct[1:])
}
