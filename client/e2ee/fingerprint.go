package e2ee

import (
	"crypto/sha512"
	"fmt"
	"strings"
)

// FingerprintIterations is libsignal's iteration count for displayable
// fingerprints.
const FingerprintIterations = 5200

func fingerprintHash(stableID string, key PublicKey, iterations int) []byte {
	kb := key.Bytes()
	h := sha512.New()
	h.Write([]byte{0, 0}) // fingerprint version 0
	h.Write(kb)
	h.Write([]byte(stableID))
	h.Write(kb)
	buf := h.Sum(nil)
	for i := 1; i < iterations; i++ {
		h.Reset()
		h.Write(buf)
		h.Write(kb)
		buf = h.Sum(buf[:0])
	}
	return buf
}

func fingerprintDigits(b []byte) string {
	var s strings.Builder
	for i := 0; i < 6; i++ {
		var x uint64
		for _, c := range b[i*5 : i*5+5] {
			x = x<<8 | uint64(c)
		}
		fmt.Fprintf(&s, "%05d", x%100000)
	}
	return s.String()
}

// SafetyNumber is libsignal's displayable fingerprint of two identities: 60
// digits, the same on both sides, to compare out of band (in person, over a
// call). Parley's stable ids are user ids and the keys are device identity
// keys, so it is computed per pair of devices.
func SafetyNumber(localID string, localKey PublicKey, remoteID string, remoteKey PublicKey) string {
	l := fingerprintDigits(fingerprintHash(localID, localKey, FingerprintIterations))
	r := fingerprintDigits(fingerprintHash(remoteID, remoteKey, FingerprintIterations))
	if l < r {
		return l + r
	}
	return r + l
}

// FormatSafetyNumber groups a safety number in blocks of five digits.
func FormatSafetyNumber(n string) string {
	var parts []string
	for i := 0; i+5 <= len(n); i += 5 {
		parts = append(parts, n[i:i+5])
	}
	return strings.Join(parts, " ")
}
