package chat

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/e2ekeys"
	"github.com/parley-im/parley/protocol/schema"
)

// firstUpload is a device's complete first keys_upload, its identity
// certified by account (nil: no account fields).
func firstUpload(t *testing.T, c Caller, account *e2ee.KeyPair) *protocol.KeyUpload {
	t.Helper()
	d, err := e2ee.OpenDevice(e2ee.NewMemoryStore(), e2ee.Address{User: c.User, Device: c.Device})
	if err != nil {
		t.Fatal(err)
	}
	up, err := d.GenerateKeys(1)
	if err != nil {
		t.Fatal(err)
	}
	k := &protocol.KeyUpload{RegistrationID: up.RegistrationID, IdentityKey: up.IdentityKey.Bytes(),
		SignedPreKey:  &protocol.PreKey{ID: up.SignedPreKey.ID, Key: up.SignedPreKey.Key.Bytes(), Sig: up.SignedPreKey.Sig},
		LastResortKEM: &protocol.PreKey{ID: up.LastResortKEM.ID, Key: up.LastResortKEM.Key, Sig: up.LastResortKEM.Sig}}
	if account != nil {
		sig := account.Private.Sign(e2ekeys.DeviceCertMessage(c.User, c.Device, k.IdentityKey))
		k.AccountKey, k.DeviceSig = account.Public.Bytes(), sig[:]
	}
	return k
}

func upload(t *testing.T, s *Service, c Caller, k *protocol.KeyUpload) *protocol.Frame {
	t.Helper()
	return call(t, s, c, &protocol.Frame{Type: protocol.TypeKeysUpload, Keys: k})
}

// Bundles and devices answers carry each device's account key and
// certificate as uploaded; a certificate that does not verify is bad_key.
func TestAccountKeyInAnswers(t *testing.T) {
	r := newPrekeyRig(t)
	s := r.service(DefaultConfig(), nil, 1)
	account := e2ee.GenerateKeyPair()
	phone := Caller{User: "alice", Device: "phone"}
	k := firstUpload(t, phone, &account)
	if got := upload(t, s, phone, k); got.Type != protocol.TypeKeys {
		t.Fatalf("upload: %s %s", got.Code, got.Error)
	}
	bob := Caller{User: "bob", Device: "b"}
	if got := call(t, s, bob, &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "alice"}); got.Type == protocol.TypeError {
		t.Fatalf("open_direct: %s %s", got.Code, got.Error)
	}
	for _, f := range []*protocol.Frame{
		{Type: protocol.TypeKeysBundle, UserID: "alice"},
		{Type: protocol.TypeKeysDevices, UserID: "alice"},
	} {
		got := call(t, s, bob, f)
		data, _ := json.Marshal(got)
		if err := schema.ServerFrame(data); err != nil {
			t.Fatalf("%s does not match the schema: %v", data, err)
		}
		var ak, sig, idk []byte
		switch {
		case len(got.Bundles) == 1:
			ak, sig, idk = got.Bundles[0].AccountKey, got.Bundles[0].DeviceSig, got.Bundles[0].IdentityKey
		case len(got.Devices) == 1:
			ak, sig, idk = got.Devices[0].AccountKey, got.Devices[0].DeviceSig, got.Devices[0].IdentityKey
		default:
			t.Fatalf("%s answered %s", f.Type, data)
		}
		if !e2ekeys.VerifyDeviceCert(ak, "alice", "phone", idk, sig) {
			t.Fatalf("%s: the device's certificate does not verify with its account key: %s", f.Type, data)
		}
	}
	// Signed by another key, for another device, or over another identity.
	other := e2ee.GenerateKeyPair()
	laptop := Caller{User: "alice", Device: "laptop"}
	for name, mut := range map[string]func(k *protocol.KeyUpload){
		"signed by another key": func(k *protocol.KeyUpload) { k.AccountKey = other.Public.Bytes() },
		"another device's":      func(k *protocol.KeyUpload) { k.DeviceSig = firstUpload(t, phone, &account).DeviceSig },
		"flipped":               func(k *protocol.KeyUpload) { k.DeviceSig[5] ^= 1 },
	} {
		k := firstUpload(t, laptop, &account)
		mut(k)
		if got := upload(t, s, laptop, k); got.Code != protocol.CodeBadKey {
			t.Errorf("%s: answered %s %s; want bad_key", name, got.Type, got.Code)
		}
	}
}

// devicesOf is user's device ids as the directory lists them.
func devicesOf(t *testing.T, s *Service, asker Caller, user string) []string {
	t.Helper()
	got := call(t, s, asker, &protocol.Frame{Type: protocol.TypeKeysDevices, UserID: user})
	if got.Type != protocol.TypeDevices {
		t.Fatalf("keys_devices: %s %s", got.Code, got.Error)
	}
	var ids []string
	for _, d := range got.Devices {
		ids = append(ids, d.DeviceID)
	}
	return ids
}

// All of a user's devices share one account key: another one is
// account_conflict, unless replace_account, which removes the other
// devices and announces each removal. An identity or account change needs
// a new certificate.
func TestAccountKeyRules(t *testing.T) {
	r := newPrekeyRig(t)
	s := r.service(DefaultConfig(), nil, 1)
	a1, a2 := e2ee.GenerateKeyPair(), e2ee.GenerateKeyPair()
	phone, laptop, tablet := Caller{User: "alice", Device: "phone"}, Caller{User: "alice", Device: "laptop"}, Caller{User: "alice", Device: "tablet"}
	bob := Caller{User: "bob", Device: "b"}
	for _, c := range []Caller{phone, laptop} {
		if got := upload(t, s, c, firstUpload(t, c, &a1)); got.Type != protocol.TypeKeys {
			t.Fatalf("%s: %s %s", c.Device, got.Code, got.Error)
		}
	}
	open := call(t, s, bob, &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "alice", E2E: true})
	if open.Type == protocol.TypeError || open.Conv == nil {
		t.Fatalf("open_direct: %s %s", open.Code, open.Error)
	}

	// A first upload without a certificate, and an identity change of a
	// device stored before account keys.
	if got := upload(t, s, tablet, firstUpload(t, tablet, nil)); got.Code != protocol.CodeInvalidArgument {
		t.Fatalf("first upload without account fields: %s %s; want invalid_argument", got.Type, got.Code)
	}
	// A device certified by another account key.
	if got := upload(t, s, tablet, firstUpload(t, tablet, &a2)); got.Code != protocol.CodeAccountConflict {
		t.Fatalf("another account key: %s %s; want account_conflict", got.Type, got.Code)
	}
	if got := upload(t, s, laptop, &protocol.KeyUpload{AccountKey: a2.Public.Bytes(),
		DeviceSig: sign(a2, laptop, devIdentity(t, s, laptop))}); got.Code != protocol.CodeAccountConflict {
		t.Fatalf("an existing device switching account key: %s %s; want account_conflict", got.Type, got.Code)
	}
	// An identity change without a certificate, and a certificate for the
	// old identity.
	k := firstUpload(t, phone, &a1)
	k.DeviceSig = nil
	if got := upload(t, s, phone, k); got.Code != protocol.CodeInvalidArgument {
		t.Fatalf("new identity without device_sig: %s %s; want invalid_argument", got.Type, got.Code)
	}
	k = firstUpload(t, phone, &a1)
	k.DeviceSig = sign(a1, phone, devIdentity(t, s, phone))
	if got := upload(t, s, phone, k); got.Code != protocol.CodeBadKey {
		t.Fatalf("new identity certified as the old one: %s %s; want bad_key", got.Type, got.Code)
	}
	if got := devicesOf(t, s, bob, "alice"); len(got) != 2 {
		t.Fatalf("refused uploads changed the directory: %v", got)
	}

	// Starting over: the tablet's account key replaces a1 and the other
	// devices go, each announced.
	k = firstUpload(t, tablet, &a2)
	k.ReplaceAccount = true
	if got := upload(t, s, tablet, k); got.Type != protocol.TypeKeys {
		t.Fatalf("replace_account: %s %s", got.Code, got.Error)
	}
	if got := devicesOf(t, s, bob, "alice"); len(got) != 1 || got[0] != "tablet" {
		t.Fatalf("after replace_account alice has devices %v; want [tablet]", got)
	}
	zero := uint64(0)
	h := call(t, s, bob, &protocol.Frame{Type: protocol.TypeHistory, ConvID: open.Conv.ConvID, AfterSeq: &zero})
	events := map[string]int{}
	for _, m := range h.Messages {
		var ev protocol.SystemEvent
		if m.Kind == "system" && json.Unmarshal([]byte(m.Body), &ev) == nil {
			events[ev.Event+"/"+ev.Device]++
		}
	}
	if events["device_removed/phone"] != 1 || events["device_removed/laptop"] != 1 || events["device_added/tablet"] != 1 {
		t.Fatalf("announced %v; want phone and laptop removed, tablet added", events)
	}
	// The old account's devices now conflict.
	if got := upload(t, s, phone, firstUpload(t, phone, &a1)); got.Code != protocol.CodeAccountConflict {
		t.Fatalf("old account after the replacement: %s %s; want account_conflict", got.Type, got.Code)
	}
}

func sign(account e2ee.KeyPair, c Caller, identity []byte) []byte {
	sig := account.Private.Sign(e2ekeys.DeviceCertMessage(c.User, c.Device, identity))
	return sig[:]
}

func devIdentity(t *testing.T, s *Service, c Caller) []byte {
	t.Helper()
	got := call(t, s, c, &protocol.Frame{Type: protocol.TypeKeysDevices, UserID: c.User})
	for _, d := range got.Devices {
		if d.DeviceID == c.Device {
			return d.IdentityKey
		}
	}
	t.Fatalf("%s/%s has no keys", c.User, c.Device)
	return nil
}

// A device stored before account keys (no account fields) may still
// refill, but a new identity needs a certificate.
func TestLegacyDeviceNeedsCertificateForNewIdentity(t *testing.T) {
	r := newPrekeyRig(t)
	s := r.service(DefaultConfig(), nil, 1)
	old := Caller{User: "carol", Device: "old"}
	k := firstUpload(t, old, nil)
	if _, err := r.st.UploadKeys(context.Background(), old.User, old.Device, store.KeyUpload{RegistrationID: k.RegistrationID,
		IdentityKey: k.IdentityKey, SignedPreKey: &store.PreKey{ID: k.SignedPreKey.ID, Key: k.SignedPreKey.Key, Sig: k.SignedPreKey.Sig},
		LastResortKEM: &store.PreKey{ID: k.LastResortKEM.ID, Key: k.LastResortKEM.Key, Sig: k.LastResortKEM.Sig}, Now: 1}); err != nil {
		t.Fatal(err)
	}
	if got := upload(t, s, old, &protocol.KeyUpload{}); got.Type != protocol.TypeKeys {
		t.Fatalf("refill of a device without an account key: %s %s", got.Code, got.Error)
	}
	if got := upload(t, s, old, firstUpload(t, old, nil)); got.Code != protocol.CodeInvalidArgument {
		t.Fatalf("new identity without a certificate: %s %s; want invalid_argument", got.Type, got.Code)
	}
	account := e2ee.GenerateKeyPair()
	if got := upload(t, s, old, firstUpload(t, old, &account)); got.Type != protocol.TypeKeys {
		t.Fatalf("new identity with a certificate: %s %s", got.Code, got.Error)
	}
}
