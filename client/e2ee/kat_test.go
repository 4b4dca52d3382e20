package e2ee

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// Known-answer tests from libsignal's published test vectors:
// rust/core/src/curve/curve25519.rs (test_agreement, test_signature),
// rust/protocol/src/ratchet/keys.rs (test_chain_key_derivation) and
// rust/protocol/tests/ratchet.rs at commit a280bc655 (X3DH v3 sessions).

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func key32(t testing.TB, s string) (k [32]byte) {
	t.Helper()
	b := unhex(t, s)
	if len(b) != 32 {
		t.Fatalf("want 32 bytes, got %d", len(b))
	}
	copy(k[:], b)
	return k
}

func TestKATAgreement(t *testing.T) {
	alicePub := PublicKey(key32(t, "1bb75966f2e93a3691dfff942bb2a466a1c08b8d78ca3f4d6df8b8bfa2e4ee28"))
	alicePriv := PrivateKey(key32(t, "c806439dc9d2c476ffed8f2580c0888d58ab406bf7ae3698879021b96bb4bf59"))
	bobPub := PublicKey(key32(t, "653614993d2b15ee9e5fd3d86ce719ef4ec1daae1886a87b3f5fa9565a27a22f"))
	bobPriv := PrivateKey(key32(t, "b03b34c33a1c44f225b662d2bf4859b8135411fa7b0386d45fb75dc5b91b4466"))
	shared := key32(t, "325f239328941ced6e673b86ba41017448e99b649a9c3806c1dd7ca4c477e629")

	a, b := NewKeyPair(alicePriv), NewKeyPair(bobPriv)
	if a.Public != alicePub || b.Public != bobPub {
		t.Fatal("public key derivation differs from libsignal's vector")
	}
	s1, err := a.Private.Agree(bobPub)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := b.Private.Agree(alicePub)
	if err != nil {
		t.Fatal(err)
	}
	if s1 != shared || s2 != shared {
		t.Fatalf("agreement %x / %x, want %x", s1, s2, shared)
	}
}

func TestKATSignature(t *testing.T) {
	priv := PrivateKey(key32(t, "c097248412e58bf05df487968205132794178e367637f5818f81e0e6ce73e865"))
	pub := PublicKey(key32(t, "ab7e717d4a163b7d9a1d8071dfe9dcf8cdcd1cea3339b6356be84d887e322c64"))
	msg := unhex(t, "05edce9d9c415ca78cb7252e72c2c4a554d3eb29485a0e1d503118d1a82d99fb4a")
	sig := unhex(t, "5de88ca9a89b4a115da79109c67c9c7464a3e4180274f1cb8c63c2984e286dfbede82deb9dcd9fae0bfbb821569b3d9001bd8130cd11d486cef047bd60b86e88")

	if NewKeyPair(priv).Public != pub {
		t.Fatal("public key derivation differs from libsignal's vector")
	}
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
	// Our own signatures verify, and not over another message.
	own := priv.Sign(msg)
	if !pub.Verify(msg, own[:]) {
		t.Fatal("own signature does not verify")
	}
	if pub.Verify(append(bytes.Clone(msg), 0), own[:]) {
		t.Fatal("own signature verifies over another message")
	}
}

func TestRandomSignatures(t *testing.T) {
	for i := 0; i < 50; i++ {
		kp := GenerateKeyPair()
		msg := GenerateKeyPair().Public.Bytes()
		sig := kp.Private.Sign(msg)
		if !kp.Public.Verify(msg, sig[:]) {
			t.Fatalf("round %d: signature does not verify", i)
		}
	}
}

func TestKATChainKey(t *testing.T) {
	seed := key32(t, "8ab72d6f4cc5ac0d387eaf463378ddb28edd07385b1cb01250c715982e7ad48f")
	wantCipher := key32(t, "bf51e9d75e0e31031051f82a2491ffc084fa298b7793bd9db620056febf45217")
	wantMAC := key32(t, "c6c77d6a73a354337a56435e34607dfe48e3ace14e77314dc6abc172e7a7030b")
	wantNext := key32(t, "28e8f8fee54b801eef7c5cfb2f17f32c7b334485bbb70fac6ec10342a246d15d")

	ck := chainKey{Key: seed}
	mk := deriveMessageKeys(ck.messageSeed())
	if mk.Cipher != wantCipher || mk.MAC != wantMAC {
		t.Fatalf("message keys %x %x", mk.Cipher, mk.MAC)
	}
	if n := ck.next(); n.Key != wantNext || n.Index != 1 {
		t.Fatalf("next chain key %x index %d", n.Key, n.Index)
	}
}

// The X3DH (version 3) vectors of tests/ratchet.rs at a280bc655.
var x3dhVector = struct {
	bobEphPub, bobEphPriv, bobIDPub, bobIDPriv, aliceBasePub, aliceBasePriv,
	aliceIDPub, aliceIDPriv, bobSPKPub, bobSPKPriv, chain string
}{
	bobEphPub:     "052cb49776b8770205745a3a6e24f579cdb4ba7a89041005928ebbadc9c05ad458",
	bobEphPriv:    "a1cab48f7c893fafa9880a28c3b4999d28d6329562d27a4ea4e22e9ff1bdd65a",
	bobIDPub:      "05f1f43874f6966956c2dd473f8fa15adeb71d1cb991b2341692324cefb1c5e626",
	bobIDPriv:     "4875cc69ddf8ea0719ec947d61081135868d5fd801f02c0225e516df2156605e",
	aliceBasePub:  "05e2c05860f2ac6b2b57ba564b421ffe71e4b128c591e46e0491cc9b33dbf22a27",
	aliceBasePriv: "10ae7c64d1e61cd596b76a0db5012673391cae66edbfcf073b4da80516a47449",
	aliceIDPub:    "05b4a8455660ada65b401007f615e654041746432e3339c6875149bceefcb42b4a",
	aliceIDPriv:   "9040f0d4e09cf38f6dc7c13779c908c015a1da4fa78737a080eb0a6f4f5f8f58",
	bobSPKPub:     "05ac248a8f263be6863576eb0362e28c828f0107a3379d34bab1586bf8c770cd67",
	bobSPKPriv:    "583900131fb727998b7803fe6ac22cc591f342e4e42a8c8d5d78194209b8d253",
	chain:         "ab9be50e5cb22a925446ab90ee5670545f4fd32902459ec274b6ad0ae5d6031a",
}

func vecPair(t *testing.T, pub, priv string) KeyPair {
	t.Helper()
	p, err := DecodePublicKey(unhex(t, pub))
	if err != nil {
		t.Fatal(err)
	}
	// Taken as given, like libsignal's KeyPair::from_public_and_private:
	// the vector's ephemeral pair is not consistent (only its public half
	// matters there).
	kp := NewKeyPair(PrivateKey(key32(t, priv)))
	kp.Public = p
	return kp
}

func TestKATX3DHAsBob(t *testing.T) {
	v := x3dhVector
	bobID := vecPair(t, v.bobIDPub, v.bobIDPriv)
	bobSPK := vecPair(t, v.bobSPKPub, v.bobSPKPriv)
	bobEph := vecPair(t, v.bobEphPub, v.bobEphPriv)
	aliceID, _ := DecodePublicKey(unhex(t, v.aliceIDPub))
	aliceBase, _ := DecodePublicKey(unhex(t, v.aliceBasePub))

	st, err := bobSession(bobParams{
		identity: bobID, signedPreKey: bobSPK, ratchet: bobEph,
		theirIdentity: aliceID, theirBaseKey: aliceBase,
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != 3 || st.LocalIdentity != bobID.Public || st.RemoteIdentity != aliceID {
		t.Fatalf("session version %d identities %x %x", st.Version, st.LocalIdentity, st.RemoteIdentity)
	}
	if got := hex.EncodeToString(st.Sender.Chain.Key[:]); got != v.chain {
		t.Fatalf("sender chain %s, want %s", got, v.chain)
	}
}

func TestKATX3DHAsAlice(t *testing.T) {
	v := x3dhVector
	aliceID := vecPair(t, v.aliceIDPub, v.aliceIDPriv)
	aliceBase := vecPair(t, v.aliceBasePub, v.aliceBasePriv)
	bobID, _ := DecodePublicKey(unhex(t, v.bobIDPub))
	bobSPK, _ := DecodePublicKey(unhex(t, v.bobSPKPub))
	bobEph, _ := DecodePublicKey(unhex(t, v.bobEphPub))

	st, _, err := aliceSession(aliceParams{
		identity: aliceID, base: aliceBase,
		theirIdentity: bobID, theirSignedPreKey: bobSPK, theirRatchet: bobEph,
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != 3 || st.LocalIdentity != aliceID.Public || st.RemoteIdentity != bobID {
		t.Fatal("session version or identities differ")
	}
	rc := st.receiverChain(bobEph)
	if rc == nil {
		t.Fatal("no receiver chain for Bob's ratchet key")
	}
	if got := hex.EncodeToString(rc.Chain.Key[:]); got != v.chain {
		t.Fatalf("receiver chain %s, want %s", got, v.chain)
	}
}
