package protocol

import (
	"strings"
	"testing"
)

func TestParseEnvelope(t *testing.T) {
	good := EncodeEnvelope(Envelope{To: []EnvelopeTo{{User: "bob", Device: "phone", Type: 3, Body: []byte{1, 2}}}})
	if _, err := ParseEnvelope(good); err != nil {
		t.Fatalf("%s: %v", good, err)
	}
	if _, err := ParseEnvelope(EncodeEnvelope(Envelope{Group: []byte{7}})); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		"hello in clear",
		`{"e2e":1}`,
		`{"e2e":2,"group":"AQ=="}`,
		`{"e2e":1,"group":"AQ==","text":"smuggled"}`,
		`{"e2e":1,"to":[{"user":"bob","device":"p","type":7,"body":"AQ=="}]}`,
		`{"e2e":1,"to":[{"user":"b b","device":"p","type":2,"body":"AQ=="}]}`,
		`{"e2e":1,"to":[{"user":"bob","device":"p","type":2,"body":""}]}`,
		`{"e2e":1,"group":"not base64!"}`,
		`{"e2e":1,"group":"AQ=="} trailing`,
		`{"e2e":1,"to":[{"user":"bob","device":"p","type":2,"body":"AQ==","note":"x"}]}`,
	} {
		if _, err := ParseEnvelope(bad); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
	var many []EnvelopeTo
	for i := 0; i <= MaxEnvelopeTo; i++ {
		many = append(many, EnvelopeTo{User: "u", Device: "d", Type: 2, Body: []byte{1}})
	}
	if _, err := ParseEnvelope(EncodeEnvelope(Envelope{To: many})); err == nil || !strings.Contains(err.Error(), "recipients") {
		t.Errorf("too many recipients: %v", err)
	}
}

func FuzzParseEnvelope(f *testing.F) {
	f.Add(EncodeEnvelope(Envelope{Group: []byte{7, 8}}))
	f.Add(`{"e2e":1,"to":[{"user":"bob","device":"phone","type":3,"body":"AQID"}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEnvelope(s)
		if err != nil {
			return
		}
		// What is accepted re-encodes to an accepted envelope.
		if _, err := ParseEnvelope(EncodeEnvelope(*e)); err != nil {
			t.Fatalf("re-encoded envelope refused: %v", err)
		}
	})
}

func TestKeysUploadValidation(t *testing.T) {
	key := append([]byte{0x05}, make([]byte, 32)...)
	sig := make([]byte, 64)
	kem := append([]byte{0x0A}, make([]byte, KEMKeyBytes-1)...)
	ok := &Frame{Type: TypeKeysUpload, Keys: &KeyUpload{RegistrationID: 1, IdentityKey: key,
		SignedPreKey: &PreKey{ID: 1, Key: key, Sig: sig}, LastResortKEM: &PreKey{ID: 2, Key: kem, Sig: sig},
		PreKeys: []PreKey{{ID: 3, Key: key}}, KEMPreKeys: []PreKey{{ID: 4, Key: kem, Sig: sig}},
		AccountKey: key, DeviceSig: sig, ReplaceAccount: true}}
	if e := validate(ok, DefaultLimits); e != nil {
		t.Fatal(e)
	}
	for name, mut := range map[string]func(k *KeyUpload){
		"short identity":   func(k *KeyUpload) { k.IdentityKey = key[:10] },
		"wrong type":       func(k *KeyUpload) { k.PreKeys = []PreKey{{ID: 1, Key: append([]byte{6}, key[1:]...)}} },
		"no signature":     func(k *KeyUpload) { k.SignedPreKey = &PreKey{ID: 1, Key: key} },
		"short KEM":        func(k *KeyUpload) { k.LastResortKEM = &PreKey{ID: 1, Key: kem[:100], Sig: sig} },
		"curve key as KEM": func(k *KeyUpload) { k.KEMPreKeys = []PreKey{{ID: 1, Key: key, Sig: sig}} },
		"short account":    func(k *KeyUpload) { k.AccountKey = key[:32] },
		"KEM as account":   func(k *KeyUpload) { k.AccountKey = kem },
		"short device sig": func(k *KeyUpload) { k.DeviceSig = sig[:63] },
	} {
		k := *ok.Keys
		mut(&k)
		if e := validate(&Frame{Type: TypeKeysUpload, Keys: &k}, DefaultLimits); e == nil || e.Code != CodeBadKey {
			t.Errorf("%s: %v", name, e)
		}
	}
	if e := validate(&Frame{Type: TypeKeysUpload}, DefaultLimits); e == nil || e.Code != CodeInvalidArgument {
		t.Errorf("no keys: %v", e)
	}
	if e := validate(&Frame{Type: TypeKeysBundle, UserID: "bad id"}, DefaultLimits); e == nil {
		t.Error("bad user id accepted")
	}
}
