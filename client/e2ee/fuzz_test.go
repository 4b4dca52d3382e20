package e2ee

import "testing"

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
