package e2ekeys_test

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/protocol/e2ekeys"
)

// The certificate message is exactly the documented bytes (docs/protocol.md,
// "Device certificates"): clients in other languages build it from there.
func TestDeviceCertMessageBytes(t *testing.T) {
	id := append([]byte{0x05}, bytes.Repeat([]byte{0xAB}, 32)...)
	got := e2ekeys.DeviceCertMessage("alice", "phone", id)
	want := hex.EncodeToString([]byte("parley device certificate v1")) + "00" +
		"0005" + hex.EncodeToString([]byte("alice")) +
		"0005" + hex.EncodeToString([]byte("phone")) +
		"05" + strings.Repeat("ab", 32)
	if hex.EncodeToString(got) != want {
		t.Fatalf("message\n got %x\nwant %s", got, want)
	}
	// The lengths keep (user, device) unambiguous.
	if bytes.Equal(e2ekeys.DeviceCertMessage("ab", "c", id), e2ekeys.DeviceCertMessage("a", "bc", id)) {
		t.Fatal("ab/c and a/bc certify the same message")
	}
}

func TestVerifyDeviceCert(t *testing.T) {
	account := e2ee.GenerateKeyPair()
	dev := e2ee.GenerateKeyPair()
	ak, idk := account.Public.Bytes(), dev.Public.Bytes()
	sig := account.Private.Sign(e2ekeys.DeviceCertMessage("alice", "phone", idk))
	if !e2ekeys.VerifyDeviceCert(ak, "alice", "phone", idk, sig[:]) {
		t.Fatal("a certificate does not verify")
	}
	other := e2ee.GenerateKeyPair().Public.Bytes()
	for name, c := range map[string]struct {
		ak        []byte
		user, dev string
		idk, sig  []byte
	}{
		"other account key":  {other, "alice", "phone", idk, sig[:]},
		"other user":         {ak, "alicf", "phone", idk, sig[:]},
		"other device":       {ak, "alice", "phonf", idk, sig[:]},
		"other identity":     {ak, "alice", "phone", other, sig[:]},
		"short signature":    {ak, "alice", "phone", idk, sig[:63]},
		"malformed account":  {ak[1:], "alice", "phone", idk, sig[:]},
		"malformed identity": {ak, "alice", "phone", idk[1:], sig[:]},
		"identity as signer": {idk, "alice", "phone", idk, sig[:]},
	} {
		if e2ekeys.VerifyDeviceCert(c.ak, c.user, c.dev, c.idk, c.sig) {
			t.Errorf("%s: verifies", name)
		}
	}
	// A prekey signature by the account key is no certificate.
	pre := account.Private.Sign(idk)
	if e2ekeys.VerifyDeviceCert(ak, "alice", "phone", idk, pre[:]) {
		t.Fatal("a signature over the bare identity key passes as a certificate")
	}
}

// BenchmarkVerifyDeviceCert is the server's cost per certified upload and
// a client's per device of a user's list.
func BenchmarkVerifyDeviceCert(b *testing.B) {
	account, dev := e2ee.GenerateKeyPair(), e2ee.GenerateKeyPair()
	ak, idk := account.Public.Bytes(), dev.Public.Bytes()
	sig := account.Private.Sign(e2ekeys.DeviceCertMessage("alice", "phone", idk))
	for b.Loop() {
		if !e2ekeys.VerifyDeviceCert(ak, "alice", "phone", idk, sig[:]) {
			b.Fatal("does not verify")
		}
	}
}
