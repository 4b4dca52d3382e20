package e2ekeys

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// libsignal's test_signature vector (rust/core/src/curve/curve25519.rs).
const (
	katPub = "ab7e717d4a163b7d9a1d8071dfe9dcf8cdcd1cea3339b6356be84d887e322c64"
	katMsg = "05edce9d9c415ca78cb7252e72c2c4a554d3eb29485a0e1d503118d1a82d99fb4a"
	katSig = "5de88ca9a89b4a115da79109c67c9c7464a3e4180274f1cb8c63c2984e286dfbede82deb9dcd9fae0bfbb821569b3d9001bd8130cd11d486cef047bd60b86e88"
)

func katKey(t testing.TB) PublicKey {
	var p PublicKey
	copy(p[:], unhex(t, katPub))
	return p
}

func TestVerifyKAT(t *testing.T) {
	pub, msg, sig := katKey(t), unhex(t, katMsg), unhex(t, katSig)
	if !pub.Verify(msg, sig) {
		t.Fatal("libsignal's signature does not verify")
	}
	for i := range sig {
		bad := bytes.Clone(sig)
		bad[i] ^= 0x01
		if pub.Verify(msg, bad) {
			t.Fatalf("signature with bit flipped in byte %d verifies", i)
		}
	}
	for i := range msg {
		bad := bytes.Clone(msg)
		bad[i] ^= 0x01
		if pub.Verify(bad, sig) {
			t.Fatalf("signature verifies over the message with byte %d flipped", i)
		}
	}
	other := pub
	other[0] ^= 0x01
	if other.Verify(msg, sig) {
		t.Fatal("signature verifies with another key")
	}
}

func TestVerifyRefusesMalformed(t *testing.T) {
	pub, msg, sig := katKey(t), unhex(t, katMsg), unhex(t, katSig)
	minusOne := PublicKey{0xEC, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
		0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F} // u = p-1 = -1: no Edwards image
	highS := bytes.Clone(sig)
	highS[63] |= 0x60 // s beyond 2^253: not reduced
	for _, tc := range []struct {
		name string
		key  PublicKey
		sig  []byte
	}{
		{"empty signature", pub, nil},
		{"short signature", pub, sig[:63]},
		{"long signature", pub, append(bytes.Clone(sig), 0)},
		{"u = -1", minusOne, sig},
		{"unreduced s", pub, highS},
		{"zero signature", pub, make([]byte, 64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.key.Verify(msg, tc.sig) {
				t.Fatal("verifies")
			}
		})
	}
}

func TestDecodePublicKey(t *testing.T) {
	pub := katKey(t)
	got, err := DecodePublicKey(pub.Bytes())
	if err != nil || got != pub {
		t.Fatalf("DecodePublicKey(Bytes()) = %x, %v; want %x", got, err, pub)
	}
	if b := pub.Bytes(); len(b) != 33 || b[0] != DjbType || !bytes.Equal(b[1:], pub[:]) {
		t.Fatalf("Bytes() = %x, want 05 || key", b)
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"raw 32 bytes", pub[:]},
		{"wrong type byte", append([]byte{0x06}, pub[:]...)},
		{"34 bytes", append(pub.Bytes(), 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodePublicKey(tc.in); !errors.Is(err, ErrBadKey) {
				t.Fatalf("err = %v, want ErrBadKey", err)
			}
		})
	}
}

func TestEqual(t *testing.T) {
	a := katKey(t)
	b := a
	if !a.Equal(b) {
		t.Fatal("a key differs from its copy")
	}
	b[31] ^= 0x80
	if a.Equal(b) {
		t.Fatal("keys differing in the last bit are equal")
	}
}

// The server runs DecodePublicKey and Verify on every keys_upload, on
// bytes any client chose: neither may panic, and a decoded key
// serializes back to its input.
func FuzzDecodeVerify(f *testing.F) {
	k := katKey(f)
	f.Add(k.Bytes(), unhex(f, katMsg), unhex(f, katSig))
	f.Add([]byte{DjbType}, []byte{}, make([]byte, 64))
	f.Fuzz(func(t *testing.T, key, msg, sig []byte) {
		p, err := DecodePublicKey(key)
		if err != nil {
			return
		}
		if !bytes.Equal(p.Bytes(), key) {
			t.Fatalf("Bytes() = %x, decoded from %x", p.Bytes(), key)
		}
		p.Verify(msg, sig)
	})
}
