package e2ee

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// The tests in this file play a malicious server: it hands out the bundles
// and relays the ciphertexts, so it can strip keys from a bundle, forge the
// first message's version and replay anything it ever relayed. The devices
// are real; only the server's part is played by the test.

// lastResortBundle is bob's bundle as a directory that ran out of one-time
// keys hands it out: the signed prekey and the never-deleted last-resort
// KEM key, the only keys a replayed first message needs.
func lastResortBundle(bob *testDev) Bundle {
	k := *bob.keys.LastResortKEM
	return Bundle{Address: bob.Address(), RegistrationID: bob.RegistrationID(), IdentityKey: bob.IdentityKey(),
		SignedPreKey: *bob.keys.SignedPreKey, KEMPreKey: &k}
}

func TestMaliciousServerStripsKEMPreKey(t *testing.T) {
	for _, otp := range []bool{true, false} {
		t.Run(fmt.Sprint("one-time=", otp), func(t *testing.T) {
			alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
			b := bob.bundle(otp, true)
			b.KEMPreKey = nil // the server strips the post-quantum prekey
			if err := alice.ProcessBundle(b); !errors.Is(err, ErrDowngrade) {
				t.Fatalf("bundle without a KEM prekey: %v, want ErrDowngrade", err)
			}
			if ok, _ := alice.HasSession(bob.Address()); ok {
				t.Fatal("a session was stored from a downgraded bundle")
			}
		})
	}
}

// x3dhSession starts a classic X3DH session from mallory's device to bob's,
// as a server (or an old client) would, whatever mallory's own policy.
func x3dhSession(t *testing.T, from, to *testDev, otp bool) {
	t.Helper()
	b := to.bundle(otp, false)
	base := GenerateKeyPair()
	p := aliceParams{identity: from.id.Key, base: base, theirIdentity: b.IdentityKey,
		theirSignedPreKey: b.SignedPreKey.Key, theirRatchet: b.SignedPreKey.Key}
	pend := &pendingPreKey{SignedPreKeyID: b.SignedPreKey.ID, BaseKey: base.Public}
	if b.PreKey != nil {
		k := b.PreKey.Key
		p.theirOneTime = &k
		pend.PreKeyID, pend.HasPreKey = b.PreKey.ID, true
	}
	st, _, err := aliceSession(p)
	if err != nil {
		t.Fatal(err)
	}
	st.Pending = pend
	st.LocalRegID, st.RemoteRegID = from.id.RegID, b.RegistrationID
	if err := from.save("session/"+to.Address().String(), sessionRecord{Current: st}); err != nil {
		t.Fatal(err)
	}
}

func TestMaliciousServerX3DHFirstMessageRefused(t *testing.T) {
	for _, otp := range []bool{true, false} {
		t.Run(fmt.Sprint("one-time=", otp), func(t *testing.T) {
			mallory, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
			x3dhSession(t, mallory, bob, otp)
			typ, ct := mustEncrypt(t, mallory, bob, "downgraded")
			if p, err := ParsePreKeySignalMessage(ct); err != nil || p.Version != VersionX3DH {
				t.Fatalf("test setup: %+v %v", p, err)
			}
			before := bob.st.Snapshot()
			if _, err := bob.Decrypt(mallory.Address(), typ, ct); !errors.Is(err, ErrDowngrade) {
				t.Fatalf("version 3 first message: %v, want ErrDowngrade", err)
			}
			if ok, _ := bob.HasSession(mallory.Address()); ok {
				t.Fatal("a session was stored from a version 3 first message")
			}
			if len(before.m) != len(bob.st.Snapshot().m) {
				t.Fatal("a refused first message changed the stored state (a one-time key consumed?)")
			}
		})
	}
}

// replayRefused checks that the captured first message no longer opens.
func replayRefused(t *testing.T, bob, alice *testDev, typ MessageType, first []byte) {
	t.Helper()
	got, err := bob.Decrypt(alice.Address(), typ, first)
	if err == nil {
		t.Fatalf("replayed first message accepted: %q", got)
	}
	if !errors.Is(err, ErrReusedBaseKey) {
		t.Fatalf("replayed first message: %v, want ErrReusedBaseKey", err)
	}
}

func TestMaliciousServerReplaysFirstMessageAfterReset(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	if err := alice.ProcessBundle(lastResortBundle(bob)); err != nil {
		t.Fatal(err)
	}
	typ, first := mustEncrypt(t, alice, bob, "transfer 100 to carol")
	mustDecrypt(t, bob, alice, typ, first, "transfer 100 to carol")
	// A server-written event makes bob forget the session, then the server
	// delivers the captured first message again.
	if err := bob.Reset(alice.Address()); err != nil {
		t.Fatal(err)
	}
	replayRefused(t, bob, alice, typ, first)
	// The memory is in the device's stored state: a restart keeps it.
	reopened, err := OpenDevice(bob.st, bob.Address())
	if err != nil {
		t.Fatal(err)
	}
	replayRefused(t, &testDev{Device: reopened, st: bob.st}, alice, typ, first)
}

func TestMaliciousServerReplaysFirstMessageAfterNewerSessions(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	if err := alice.ProcessBundle(lastResortBundle(bob)); err != nil {
		t.Fatal(err)
	}
	typ, first := mustEncrypt(t, alice, bob, "first")
	mustDecrypt(t, bob, alice, typ, first, "first")
	// 41 newer sessions push the first one out of bob's archive (40 kept).
	for i := 0; i < MaxArchivedStates+1; i++ {
		if err := alice.ProcessBundle(lastResortBundle(bob)); err != nil {
			t.Fatal(err)
		}
		typ, ct := mustEncrypt(t, alice, bob, fmt.Sprint("session ", i))
		mustDecrypt(t, bob, alice, typ, ct, fmt.Sprint("session ", i))
	}
	replayRefused(t, bob, alice, typ, first)
}

// The second first-message of one initiation (sent before any answer)
// carries the same base key: it opens while the session is stored.
func TestLastResortSessionKeepsLaterPreKeyMessages(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	if err := alice.ProcessBundle(lastResortBundle(bob)); err != nil {
		t.Fatal(err)
	}
	typ1, m1 := mustEncrypt(t, alice, bob, "one")
	typ2, m2 := mustEncrypt(t, alice, bob, "two")
	mustDecrypt(t, bob, alice, typ2, m2, "two")
	mustDecrypt(t, bob, alice, typ1, m1, "one")
	if _, err := bob.Decrypt(alice.Address(), typ1, m1); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate within the session: %v", err)
	}
}

// The remembered base keys of a signed prekey go with it.
func TestUsedBaseKeysDroppedWithTheirSignedPreKey(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	for i := 0; i < 3; i++ {
		if err := alice.ProcessBundle(lastResortBundle(bob)); err != nil {
			t.Fatal(err)
		}
		typ, ct := mustEncrypt(t, alice, bob, "x")
		mustDecrypt(t, bob, alice, typ, ct, "x")
	}
	count := func() int {
		keys, err := bob.st.List(usedBaseKeyPrefix)
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}
	if n := count(); n != 3 {
		t.Fatalf("%d base keys remembered, want 3", n)
	}
	if _, err := bob.RotateSignedPreKey(); err != nil {
		t.Fatal(err)
	}
	if err := bob.PruneSignedPreKeys(1); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		keys, _ := bob.st.List(usedBaseKeyPrefix)
		t.Fatalf("base keys of a pruned signed prekey kept: %s", strings.Join(keys, " "))
	}
}

// Where classic X3DH is allowed, a first message without a one-time key is
// remembered the same way.
func TestMaliciousServerReplaysX3DHFirstMessage(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	alice.SetAllowX3DH(true)
	bob.SetAllowX3DH(true)
	start(t, alice, bob, false, false)
	typ, first := mustEncrypt(t, alice, bob, "first")
	mustDecrypt(t, bob, alice, typ, first, "first")
	if err := bob.Reset(alice.Address()); err != nil {
		t.Fatal(err)
	}
	replayRefused(t, bob, alice, typ, first)
}

// A first message that consumed a one-time key cannot be replayed after a
// reset either: the key is gone.
func TestMaliciousServerReplaysOneTimeKeyFirstMessage(t *testing.T) {
	for _, c := range []struct {
		name string
		otp  bool
	}{{"one-time KEM prekey", false}, {"both one-time prekeys", true}} {
		t.Run(c.name, func(t *testing.T) {
			alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
			start(t, alice, bob, c.otp, true)
			typ, first := mustEncrypt(t, alice, bob, "first")
			mustDecrypt(t, bob, alice, typ, first, "first")
			if err := bob.Reset(alice.Address()); err != nil {
				t.Fatal(err)
			}
			if _, err := bob.Decrypt(alice.Address(), typ, first); !errors.Is(err, ErrInvalidPreKey) {
				t.Fatalf("replay after a reset: %v, want ErrInvalidPreKey", err)
			}
		})
	}
}

// The server relabels a captured first message as another sender's: the
// base key is remembered whatever the claimed sender.
func TestMaliciousServerReplaysFirstMessageAsAnotherSender(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	if err := alice.ProcessBundle(lastResortBundle(bob)); err != nil {
		t.Fatal(err)
	}
	typ, first := mustEncrypt(t, alice, bob, "first")
	mustDecrypt(t, bob, alice, typ, first, "first")
	if _, err := bob.Decrypt(Address{User: "carol", Device: "c"}, typ, first); !errors.Is(err, ErrReusedBaseKey) {
		t.Fatalf("first message relabelled as carol's: %v, want ErrReusedBaseKey", err)
	}
}
