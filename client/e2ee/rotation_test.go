package e2ee

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeClock is a settable clock for the key-rotation tests.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

// newClockedDev is newTestDev with its keys made at the clock's time.
func newClockedDev(t *testing.T, user, device string, clock *fakeClock) *testDev {
	t.Helper()
	st := NewMemoryStore()
	d, err := OpenDevice(st, Address{user, device})
	if err != nil {
		t.Fatal(err)
	}
	d.SetClock(clock.now)
	up, err := d.GenerateKeys(5)
	if err != nil {
		t.Fatal(err)
	}
	return &testDev{Device: d, st: st, keys: up}
}

// currentLastResortBundle is bob's bundle on his current signed prekey and
// last-resort KEM key (no one-time keys), as a directory hands it out once
// it has them.
func currentLastResortBundle(bob *testDev, spk SignedPreKey, lr KEMPreKey) Bundle {
	return Bundle{Address: bob.Address(), RegistrationID: bob.RegistrationID(), IdentityKey: bob.IdentityKey(),
		SignedPreKey: spk, KEMPreKey: &lr}
}

func storeKeys(t *testing.T, st *MemoryStore, prefix string) []string {
	t.Helper()
	keys, err := st.List(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// The signed prekey and the last-resort KEM key are due for rotation once
// older than the interval; a replaced key still opens first messages in
// flight during the grace period, and a replay of one stays refused; once
// pruned, the key is gone with the base keys remembered for it, and a
// replay fails for want of the key.
func TestKeyRotationGraceAndReplay(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	bob := newClockedDev(t, "bob", "b", clock)
	alice := newTestDev(t, "alice", "a")
	const every, grace = 48 * time.Hour, 30 * 24 * time.Hour

	clock.advance(47 * time.Hour)
	if spk, lr, err := bob.RotationDue(every); err != nil || spk || lr {
		t.Fatalf("due after 47 h: %v %v %v", spk, lr, err)
	}
	// A first message on the old keys is in flight when bob rotates.
	if err := alice.ProcessBundle(lastResortBundle(bob)); err != nil {
		t.Fatal(err)
	}
	typ, first := mustEncrypt(t, alice, bob, "in flight")
	clock.advance(2 * time.Hour)
	if spk, lr, err := bob.RotationDue(every); err != nil || !spk || !lr {
		t.Fatalf("due after 49 h: %v %v %v", spk, lr, err)
	}
	spk2, err := bob.RotateSignedPreKey()
	if err != nil {
		t.Fatal(err)
	}
	lr2, err := bob.RotateLastResortKEM()
	if err != nil {
		t.Fatal(err)
	}
	if spk2.ID == bob.keys.SignedPreKey.ID || lr2.ID == bob.keys.LastResortKEM.ID ||
		VerifyBundle(currentLastResortBundle(bob, spk2, lr2)) != nil {
		t.Fatalf("rotated keys %d %d", spk2.ID, lr2.ID)
	}
	if spk, lr, err := bob.RotationDue(every); err != nil || spk || lr {
		t.Fatalf("due right after rotating: %v %v %v", spk, lr, err)
	}
	if cs, cl, err := bob.CurrentPreKeys(); err != nil || cs.ID != spk2.ID || cl.ID != lr2.ID {
		t.Fatalf("current keys %d %d %v", cs.ID, cl.ID, err)
	}
	mustDecrypt(t, bob, alice, typ, first, "in flight")

	// The server replays the first message after the session is gone:
	// refused while the old keys are kept, however close to the end of the
	// grace period.
	if err := bob.Reset(alice.Address()); err != nil {
		t.Fatal(err)
	}
	clock.advance(grace - time.Minute)
	if err := bob.PruneRetiredKeys(grace); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.Decrypt(alice.Address(), typ, first); !errors.Is(err, ErrReusedBaseKey) {
		t.Fatalf("replay within the grace period: %v, want ErrReusedBaseKey", err)
	}

	// A session on the new keys, and its replay refused too.
	carol := newTestDev(t, "carol", "c")
	if err := carol.ProcessBundle(currentLastResortBundle(bob, spk2, lr2)); err != nil {
		t.Fatal(err)
	}
	typ2, first2 := mustEncrypt(t, carol, bob, "on the new keys")
	mustDecrypt(t, bob, carol, typ2, first2, "on the new keys")

	clock.advance(2 * time.Minute)
	if err := bob.PruneRetiredKeys(grace); err != nil {
		t.Fatal(err)
	}
	old := bob.keys
	for _, k := range []string{idKey("signed/", old.SignedPreKey.ID), idKey("kem/", old.LastResortKEM.ID)} {
		if b, _ := bob.st.Load(k); b != nil {
			t.Fatalf("%s kept after the grace period", k)
		}
	}
	if k := storeKeys(t, bob.st, usedBaseKeyPrefix+strconv.FormatUint(uint64(old.SignedPreKey.ID), 10)+"/"); len(k) != 0 {
		t.Fatalf("base keys of a pruned signed prekey kept: %v", k)
	}
	if _, err := bob.Decrypt(alice.Address(), typ, first); !errors.Is(err, ErrInvalidPreKey) {
		t.Fatalf("replay after the old keys were pruned: %v, want ErrInvalidPreKey", err)
	}
	// The current keys and what was remembered for them stay.
	if err := bob.Reset(carol.Address()); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.Decrypt(carol.Address(), typ2, first2); !errors.Is(err, ErrReusedBaseKey) {
		t.Fatalf("replay on the current keys after a prune: %v, want ErrReusedBaseKey", err)
	}
	dave := newTestDev(t, "dave", "d")
	if err := dave.ProcessBundle(currentLastResortBundle(bob, spk2, lr2)); err != nil {
		t.Fatal(err)
	}
	typ, ct := mustEncrypt(t, dave, bob, "later")
	mustDecrypt(t, bob, dave, typ, ct, "later")
}

// Rotating only the last-resort KEM key: the signed prekey stays, so the
// base keys remembered under it are forgotten exactly for the pruned KEM
// key, and a replay on the pruned KEM key fails for want of it while one
// on the current KEM key stays refused as reused.
func TestLastResortKEMRotationForgetsOnlyItsBaseKeys(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	bob := newClockedDev(t, "bob", "b", clock)
	spk := *bob.keys.SignedPreKey
	alice, carol := newTestDev(t, "alice", "a"), newTestDev(t, "carol", "c")
	if err := alice.ProcessBundle(lastResortBundle(bob)); err != nil {
		t.Fatal(err)
	}
	typ1, first1 := mustEncrypt(t, alice, bob, "on the first last-resort key")
	mustDecrypt(t, bob, alice, typ1, first1, "on the first last-resort key")

	lr2, err := bob.RotateLastResortKEM()
	if err != nil {
		t.Fatal(err)
	}
	if err := carol.ProcessBundle(currentLastResortBundle(bob, spk, lr2)); err != nil {
		t.Fatal(err)
	}
	typ2, first2 := mustEncrypt(t, carol, bob, "on the second")
	mustDecrypt(t, bob, carol, typ2, first2, "on the second")

	clock.advance(31 * 24 * time.Hour)
	if err := bob.PruneRetiredKeys(30 * 24 * time.Hour); err != nil {
		t.Fatal(err)
	}
	if b, _ := bob.st.Load(idKey("signed/", spk.ID)); b == nil {
		t.Fatal("the current signed prekey was pruned")
	}
	for _, k := range storeKeys(t, bob.st, usedBaseKeyPrefix) {
		if strings.Split(k, "/")[2] == strconv.FormatUint(uint64(bob.keys.LastResortKEM.ID), 10) {
			t.Fatalf("base key of the pruned KEM key kept: %s", k)
		}
	}
	for _, peer := range []*testDev{alice, carol} {
		if err := bob.Reset(peer.Address()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := bob.Decrypt(alice.Address(), typ1, first1); !errors.Is(err, ErrInvalidPreKey) {
		t.Fatalf("replay on the pruned KEM key: %v, want ErrInvalidPreKey", err)
	}
	if _, err := bob.Decrypt(carol.Address(), typ2, first2); !errors.Is(err, ErrReusedBaseKey) {
		t.Fatalf("replay on the current KEM key: %v, want ErrReusedBaseKey", err)
	}
	// One-time KEM prekeys are not last-resort keys: a prune leaves them.
	if b, _ := bob.st.Load(idKey("kem/", bob.keys.KEMPreKeys[4].ID)); b == nil {
		t.Fatal("a one-time KEM prekey was pruned")
	}
}

// Keys made before their ages were recorded are due at once.
func TestRotationDueForKeysOfUnknownAge(t *testing.T) {
	bob := newTestDev(t, "bob", "b")
	var m metaRecord
	if _, err := bob.load("meta", &m); err != nil {
		t.Fatal(err)
	}
	m.SignedAt, m.LastResortAt = 0, 0
	if err := bob.save("meta", m); err != nil {
		t.Fatal(err)
	}
	if spk, lr, err := bob.RotationDue(48 * time.Hour); err != nil || !spk || !lr {
		t.Fatalf("keys of unknown age: due %v %v %v", spk, lr, err)
	}
	// A device without keys has nothing to rotate.
	fresh, err := OpenDevice(NewMemoryStore(), Address{"erin", "e"})
	if err != nil {
		t.Fatal(err)
	}
	if spk, lr, err := fresh.RotationDue(48 * time.Hour); err != nil || spk || lr {
		t.Fatalf("device without keys: due %v %v %v", spk, lr, err)
	}
}
