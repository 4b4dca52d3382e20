package e2ee

import (
	"bytes"
	"errors"
	"testing"
)

func certOf(t testing.TB, d *testDev) DeviceCert {
	t.Helper()
	ak, sig, err := d.DeviceCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return DeviceCert{Address: d.Address(), IdentityKey: d.IdentityKey(), AccountKey: ak.Bytes(), Sig: sig}
}

// withAccount gives d an account key: a fresh one, or account's.
func withAccount(t testing.TB, d *testDev, account *testDev) *testDev {
	t.Helper()
	if account == nil {
		if _, err := d.CreateAccountKey(); err != nil {
			t.Fatal(err)
		}
		return d
	}
	b, err := account.ExportAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.ImportAccountKey(b); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestAccountKeyExportImport(t *testing.T) {
	a := newTestDev(t, "alice", "phone")
	if _, _, err := a.DeviceCertificate(); !errors.Is(err, ErrNoAccount) {
		t.Fatalf("certificate without an account key: %v", err)
	}
	withAccount(t, a, nil)
	b := withAccount(t, newTestDev(t, "alice", "laptop"), a)
	ka, _, _ := a.AccountKey()
	kb, ok, err := b.AccountKey()
	if err != nil || !ok || ka != kb {
		t.Fatalf("imported account key %x, want %x (%v)", kb, ka, err)
	}
	if !certOf(t, b).Valid() || !certOf(t, a).Valid() {
		t.Fatal("a device's own certificate does not verify")
	}
	exp, _ := a.ExportAccountKey()
	for _, bad := range [][]byte{nil, []byte("parley-account-key-v1 "), exp[1:], bytes.Replace(exp, []byte("v1"), []byte("v2"), 1),
		append(bytes.TrimSuffix(exp, []byte("\n")), '='), append([]byte(nil), exp[:len(exp)-3]...)} {
		if _, err := ParseAccountKey(bad); err == nil {
			t.Errorf("ParseAccountKey(%q) accepted", bad)
		}
	}
}

func FuzzParseAccountKey(f *testing.F) {
	f.Add(MarshalAccountKey(GenerateKeyPair()))
	f.Add([]byte("parley-account-key-v1 AAAA\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseAccountKey(b)
		if err != nil {
			return
		}
		// What parses re-encodes to itself (the final newline optional).
		if got := MarshalAccountKey(k); !bytes.Equal(bytes.TrimSuffix(got, []byte("\n")), bytes.TrimSuffix(b, []byte("\n"))) {
			t.Fatalf("%q re-encodes as %q", b, got)
		}
	})
}

// A peer's account key is recorded on first sight; a device it did not
// certify is refused; another account key is a change.
func TestAcceptDevices(t *testing.T) {
	me := withAccount(t, newTestDev(t, "me", "m"), nil)
	phone := withAccount(t, newTestDev(t, "alice", "phone"), nil)
	laptop := withAccount(t, newTestDev(t, "alice", "laptop"), phone)
	ghost := withAccount(t, newTestDev(t, "alice", "ghost"), nil) // the server's: another account key
	unsigned := certOf(t, laptop)
	unsigned.Device, unsigned.Sig = "unsigned", nil

	// Two account keys for a user never seen: no way to tell which is
	// the user's, all refused.
	chk, err := me.AcceptDevices("alice", []DeviceCert{certOf(t, phone), certOf(t, ghost)})
	if err != nil || len(chk.Accepted) != 0 || len(chk.Refused) != 2 {
		t.Fatalf("mixed first list: %+v %v", chk, err)
	}
	chk, err = me.AcceptDevices("alice", []DeviceCert{certOf(t, phone), unsigned})
	if err != nil || len(chk.Accepted) != 1 || len(chk.Refused) != 1 || chk.Change != nil {
		t.Fatalf("first list: %+v %v", chk, err)
	}
	// Then the server adds a device under another key and one it signed
	// with nothing: both refused, alice's known devices accepted.
	chk, err = me.AcceptDevices("alice", []DeviceCert{certOf(t, phone), certOf(t, laptop), certOf(t, ghost), unsigned})
	if err != nil || len(chk.Accepted) != 2 || len(chk.Refused) != 2 || chk.Change != nil {
		t.Fatalf("list with a ghost: %+v %v", chk, err)
	}
	for _, d := range []*testDev{phone, laptop} {
		if ok, _ := me.Certified(d.Address(), d.IdentityKey()); !ok {
			t.Fatalf("%s not certified", d.Address())
		}
	}
	if ok, _ := me.Certified(ghost.Address(), ghost.IdentityKey()); ok {
		t.Fatal("the ghost device is certified")
	}
	// A bundle's device is taken only under the trusted key.
	if err := me.AcceptDevice(certOf(t, ghost)); !errors.Is(err, ErrBadCertificate) {
		t.Fatalf("ghost bundle: %v", err)
	}
	// Certificates for the other user, the other device or the other
	// identity do not pass.
	swapped := certOf(t, phone)
	swapped.IdentityKey = ghost.IdentityKey()
	if err := me.AcceptDevice(swapped); !errors.Is(err, ErrBadCertificate) {
		t.Fatalf("substituted identity key: %v", err)
	}

	// Verified, then the whole list is under a new account key.
	if _, err := me.VerifyAccount("alice"); err != nil {
		t.Fatal(err)
	}
	re := withAccount(t, newTestDev(t, "alice", "phone"), nil) // reinstalled: new account
	chk, err = me.AcceptDevices("alice", []DeviceCert{certOf(t, re)})
	if err != nil || chk.Change == nil || !chk.Change.Accepted || !chk.Change.WasVerified || len(chk.Accepted) != 1 {
		t.Fatalf("change of a verified user: %+v %v", chk, err)
	}
	if err := me.MaySend("alice"); !errors.Is(err, ErrVerifiedChanged) {
		t.Fatalf("sending to a changed verified user: %v", err)
	}
	if _, err := me.VerifyAccount("alice"); err != nil {
		t.Fatal(err)
	}
	if err := me.MaySend("alice"); err != nil {
		t.Fatalf("after verifying again: %v", err)
	}

	// Strict: a change is refused, nothing of the new account accepted,
	// until TrustAccount.
	me.SetTrustPolicy(TrustStrict)
	re2 := withAccount(t, newTestDev(t, "alice", "phone"), nil)
	chk, err = me.AcceptDevices("alice", []DeviceCert{certOf(t, re2)})
	var ue *UntrustedAccountError
	if !errors.As(err, &ue) || !errors.Is(err, ErrUntrusted) || len(chk.Accepted) != 0 || chk.Change == nil || chk.Change.Accepted {
		t.Fatalf("strict change: %+v %v", chk, err)
	}
	if ok, _ := me.Certified(re2.Address(), re2.IdentityKey()); ok {
		t.Fatal("strict policy certified the new account's device")
	}
	if err := me.MaySend("alice"); !errors.As(err, &ue) {
		t.Fatalf("sending while a change is pending: %v", err)
	}
	if err := me.TrustAccount("alice"); err != nil {
		t.Fatal(err)
	}
	if err := me.MaySend("alice"); !errors.Is(err, ErrVerifiedChanged) {
		t.Fatalf("accepted change of a verified user: %v; want blocked until verified", err)
	}
	if chk, err = me.AcceptDevices("alice", []DeviceCert{certOf(t, re2)}); err != nil || len(chk.Accepted) != 1 || chk.Change != nil {
		t.Fatalf("after TrustAccount: %+v %v", chk, err)
	}

	// Own devices: only the own account key certifies them.
	mine := withAccount(t, newTestDev(t, "me", "laptop"), me)
	foreign := withAccount(t, newTestDev(t, "me", "ghost"), nil)
	chk, err = me.AcceptDevices("me", []DeviceCert{certOf(t, mine), certOf(t, foreign)})
	if err != nil || len(chk.Accepted) != 1 || chk.Accepted[0].Device != "laptop" || chk.Change != nil {
		t.Fatalf("own devices: %+v %v", chk, err)
	}
}

func TestPublicKeysIsAFirstUpload(t *testing.T) {
	d := newTestDev(t, "alice", "phone")
	up, err := d.PublicKeys()
	if err != nil || up.SignedPreKey == nil || up.LastResortKEM == nil || up.IdentityKey != d.IdentityKey() ||
		up.SignedPreKey.ID != d.keys.SignedPreKey.ID || !bytes.Equal(up.LastResortKEM.Key, d.keys.LastResortKEM.Key) {
		t.Fatalf("public keys %+v %v", up, err)
	}
}
