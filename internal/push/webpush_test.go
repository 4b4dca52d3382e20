package push

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"testing"
)

func b64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWebPushRFC8291Vector: the encryption of RFC 8291 section 5 (the
// inputs and result of its Appendix A), byte for byte.
func TestWebPushRFC8291Vector(t *testing.T) {
	as, err := ecdh.P256().NewPrivateKey(b64(t, "yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw"))
	if err != nil {
		t.Fatal(err)
	}
	if got := base64.RawURLEncoding.EncodeToString(as.PublicKey().Bytes()); got != "BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A8" {
		t.Fatalf("application server public key %s", got)
	}
	got, err := encryptWebPush([]byte("When I grow up, I want to be a watermelon"),
		b64(t, "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"),
		b64(t, "BTBZMqHH6r4Tts7J_aSIgg"), as, b64(t, "DGv6ra1nlYgDCS1FRnbzlw"))
	if err != nil {
		t.Fatal(err)
	}
	const want = "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN"
	if s := base64.RawURLEncoding.EncodeToString(got); s != want {
		t.Fatalf("encrypted message\n got %s\nwant %s", s, want)
	}
}

// decryptWebPush is the user agent's side (RFC 8291 section 3.4), for the
// test provider.
func decryptWebPush(ua *ecdh.PrivateKey, auth, msg []byte) ([]byte, bool) {
	if len(msg) < 21 || int(msg[20]) != 65 || len(msg) < 86 {
		return nil, false
	}
	salt, asPub := msg[:16], msg[21:86]
	as, err := ecdh.P256().NewPublicKey(asPub)
	if err != nil {
		return nil, false
	}
	shared, err := ua.ECDH(as)
	if err != nil {
		return nil, false
	}
	info := append(append([]byte("WebPush: info\x00"), ua.PublicKey().Bytes()...), asPub...)
	ikm, _ := hkdf.Key(sha256.New, shared, auth, string(info), 32)
	prk, _ := hkdf.Extract(sha256.New, ikm, salt)
	cek, _ := hkdf.Expand(sha256.New, prk, "Content-Encoding: aes128gcm\x00", 16)
	nonce, _ := hkdf.Expand(sha256.New, prk, "Content-Encoding: nonce\x00", 12)
	blk, _ := aes.NewCipher(cek)
	gcm, _ := cipher.NewGCM(blk)
	pt, err := gcm.Open(nil, nonce, msg[86:], nil)
	if err != nil || len(pt) == 0 || pt[len(pt)-1] != 2 {
		return nil, false
	}
	return bytes.TrimRight(pt[:len(pt)-1], "\x00"), true
}

// FuzzWebPushRoundTrip: what EncryptWebPush seals, the user agent opens.
func FuzzWebPushRoundTrip(f *testing.F) {
	f.Add([]byte("hello"))
	f.Add([]byte{})
	ua, _ := ecdh.P256().GenerateKey(rand.Reader)
	auth := bytes.Repeat([]byte{7}, 16)
	f.Fuzz(func(t *testing.T, pt []byte) {
		if len(pt) > 3000 {
			return
		}
		msg, err := EncryptWebPush(pt, ua.PublicKey().Bytes(), auth)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := decryptWebPush(ua, auth, msg)
		if !ok || !bytes.Equal(bytes.TrimRight(pt, "\x00"), got) {
			t.Fatalf("round trip of %q: %q, %v", pt, got, ok)
		}
	})
}
