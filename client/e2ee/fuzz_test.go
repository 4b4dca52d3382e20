package e2ee

import (
	"bytes"
	"crypto/sha256"
	"testing"
)

func FuzzParseMessages(f *testing.F) {
	alice, bob := newTestDev(f, "alice", "a"), newTestDev(f, "bob", "b")
	if err := alice.ProcessBundle(bob.bundle(true, true)); err != nil {
		f.Fatal(err)
	}
	_, pk, _ := alice.Encrypt(bob.Address(), []byte("seed"))
	p, _ := ParsePreKeySignalMessage(pk)
	f.Add(pk)
	f.Add(p.Message.Serialized)
	skdm, _ := alice.GroupDistribution("g", FormatModern)
	f.Add(skdm)
	gm, _ := alice.GroupEncrypt("g", []byte("x"), FormatModern)
	f.Add(gm)
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseSignalMessage(b)
		ParsePreKeySignalMessage(b)
		for _, fm := range []SenderKeyFormat{FormatModern, FormatLegacy} {
			ParseSenderKeyMessage(b, fm)
			ParseSenderKeyDistributionMessage(b, fm)
		}
		// Decrypting garbage must fail cleanly, never panic.
		bob.Decrypt(alice.Address(), TypeSignal, b)
		bob.Decrypt(alice.Address(), TypePreKey, b)
		bob.GroupDecrypt("g", alice.Address(), b, FormatModern)
	})
}

// FuzzDecryptAttachment: arbitrary bytes under a key, with their own
// digest (so the MAC check is reached) and a seed's ciphertext with
// changed bytes, never panic and never yield plaintext unless the MAC
// verifies.
func FuzzDecryptAttachment(f *testing.F) {
	key := make([]byte, AttachmentKeySize)
	var seed bytes.Buffer
	// A fixed IV: every fuzz worker makes the same seed.
	digest, err := encryptAttachment(&seed, bytes.NewReader([]byte("seed plaintext")), 14, key, make([]byte, 16))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed.Bytes(), int64(14), uint16(0), byte(0))
	f.Add(seed.Bytes(), int64(600), uint16(20), byte(1))
	f.Add([]byte{}, int64(0), uint16(0), byte(0))
	f.Add(make([]byte, 64), int64(3), uint16(5), byte(0xff))
	f.Fuzz(func(t *testing.T, ct []byte, size int64, at uint16, x byte) {
		sum := sha256.Sum256(ct)
		var out bytes.Buffer
		err := DecryptAttachment(&out, bytes.NewReader(ct), int64(len(ct)), key, sum[:], size)
		if err != nil && out.Len() != 0 {
			t.Fatalf("%v after writing %d bytes", err, out.Len())
		}
		if err == nil && !bytes.Equal(ct, seed.Bytes()) {
			t.Fatalf("bytes that are not the seed's ciphertext decrypted under its key")
		}
		// The seed with one byte changed: refused, nothing written.
		if x != 0 {
			b := bytes.Clone(seed.Bytes())
			b[int(at)%len(b)] ^= x
			out.Reset()
			if err := DecryptAttachment(&out, bytes.NewReader(b), int64(len(b)), key, digest, 14); err == nil || out.Len() != 0 {
				t.Fatalf("tampered seed at %d: err %v, %d bytes", int(at)%len(b), err, out.Len())
			}
		}
	})
}
