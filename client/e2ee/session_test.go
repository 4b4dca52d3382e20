package e2ee

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"testing"
)

type testDev struct {
	*Device
	st   *MemoryStore
	keys KeyUpload
	next int // next one-time key handed out
}

func newTestDev(t testing.TB, user, device string) *testDev {
	t.Helper()
	st := NewMemoryStore()
	d, err := OpenDevice(st, Address{user, device})
	if err != nil {
		t.Fatal(err)
	}
	up, err := d.GenerateKeys(5)
	if err != nil {
		t.Fatal(err)
	}
	return &testDev{Device: d, st: st, keys: up}
}

// bundle plays the key directory: each one-time key is handed out once.
func (d *testDev) bundle(otp, pq bool) Bundle {
	b := Bundle{Address: d.Address(), RegistrationID: d.RegistrationID(), IdentityKey: d.IdentityKey(),
		SignedPreKey: *d.keys.SignedPreKey}
	if otp {
		k := d.keys.PreKeys[d.next]
		b.PreKey = &k
	}
	if pq {
		k := d.keys.KEMPreKeys[d.next]
		b.KEMPreKey = &k
	}
	d.next++
	return b
}

func mustEncrypt(t testing.TB, from *testDev, to *testDev, msg string) (MessageType, []byte) {
	t.Helper()
	typ, ct, err := from.Encrypt(to.Address(), []byte(msg))
	if err != nil {
		t.Fatal(err)
	}
	return typ, ct
}

func mustDecrypt(t testing.TB, to *testDev, from *testDev, typ MessageType, ct []byte, want string) {
	t.Helper()
	got, err := to.Decrypt(from.Address(), typ, ct)
	if err != nil {
		t.Fatalf("decrypt %q: %v", want, err)
	}
	if string(got) != want {
		t.Fatalf("decrypted %q, want %q", got, want)
	}
}

func start(t testing.TB, alice, bob *testDev, otp, pq bool) {
	t.Helper()
	if err := alice.ProcessBundle(bob.bundle(otp, pq)); err != nil {
		t.Fatal(err)
	}
}

func TestSessionConversation(t *testing.T) {
	for _, c := range []struct {
		name    string
		otp, pq bool
		version uint8
	}{{"pqxdh", true, true, VersionPQXDH}, {"x3dh", true, false, VersionX3DH}, {"pqxdh-no-one-time", false, true, VersionPQXDH}, {"x3dh-no-one-time", false, false, VersionX3DH}} {
		t.Run(c.name, func(t *testing.T) {
			alice, bob := newTestDev(t, "alice", "phone"), newTestDev(t, "bob", "laptop")
			if !c.pq { // classic X3DH only where both sides allow it
				alice.SetAllowX3DH(true)
				bob.SetAllowX3DH(true)
			}
			start(t, alice, bob, c.otp, c.pq)
			// Alice's messages are PreKey messages until Bob answers.
			for i := 0; i < 3; i++ {
				typ, ct := mustEncrypt(t, alice, bob, fmt.Sprint("hello ", i))
				if typ != TypePreKey {
					t.Fatalf("message %d has type %d before any answer", i, typ)
				}
				p, err := ParsePreKeySignalMessage(ct)
				if err != nil || p.Version != c.version || p.HasPreKey != c.otp {
					t.Fatalf("prekey message: %+v, %v", p, err)
				}
				mustDecrypt(t, bob, alice, typ, ct, fmt.Sprint("hello ", i))
			}
			// Ping-pong: each turn is a DH ratchet step.
			for i := 0; i < 10; i++ {
				typ, ct := mustEncrypt(t, bob, alice, fmt.Sprint("b", i))
				if typ != TypeSignal {
					t.Fatalf("answer has type %d", typ)
				}
				mustDecrypt(t, alice, bob, typ, ct, fmt.Sprint("b", i))
				typ, ct = mustEncrypt(t, alice, bob, fmt.Sprint("a", i))
				if typ != TypeSignal {
					t.Fatalf("Alice still sends type %d after Bob's answer", typ)
				}
				mustDecrypt(t, bob, alice, typ, ct, fmt.Sprint("a", i))
			}
		})
	}
}

func TestBadSignedPreKeySignatureRefused(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	b := bob.bundle(true, true)
	b.SignedPreKey.Sig = bytes.Clone(b.SignedPreKey.Sig)
	b.SignedPreKey.Sig[5] ^= 1
	if err := alice.ProcessBundle(b); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("bad signed prekey signature: %v", err)
	}
	b = bob.bundle(true, true)
	b.KEMPreKey.Sig = bytes.Clone(b.KEMPreKey.Sig)
	b.KEMPreKey.Sig[0] ^= 1
	if err := alice.ProcessBundle(b); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("bad KEM prekey signature: %v", err)
	}
	// A signature by another identity is refused too.
	b = bob.bundle(true, true)
	b.IdentityKey = alice.IdentityKey()
	if err := alice.ProcessBundle(b); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("signature by another key: %v", err)
	}
	if ok, _ := alice.HasSession(bob.Address()); ok {
		t.Fatal("a session was stored from a bad bundle")
	}
}

func TestDuplicateAndReplayRefused(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	start(t, alice, bob, true, true)
	typ, first := mustEncrypt(t, alice, bob, "first")
	mustDecrypt(t, bob, alice, typ, first, "first")
	// Replaying the PreKey message: its one-time keys are gone and the
	// session it built refuses the counter again.
	if _, err := bob.Decrypt(alice.Address(), typ, first); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("replayed PreKey message: %v", err)
	}
	at, act := mustEncrypt(t, bob, alice, "ack")
	mustDecrypt(t, alice, bob, at, act, "ack")
	typ, ct := mustEncrypt(t, alice, bob, "second")
	mustDecrypt(t, bob, alice, typ, ct, "second")
	if _, err := bob.Decrypt(alice.Address(), typ, ct); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate message: %v", err)
	}
}

func TestOutOfOrderWithinLimits(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	start(t, alice, bob, true, true)
	typ, ct := mustEncrypt(t, alice, bob, "start")
	mustDecrypt(t, bob, alice, typ, ct, "start")
	typ, ct = mustEncrypt(t, bob, alice, "ack")
	mustDecrypt(t, alice, bob, typ, ct, "ack")

	type msg struct {
		typ MessageType
		ct  []byte
		txt string
	}
	var chain1, chain2 []msg
	for i := 0; i < 50; i++ {
		typ, ct := mustEncrypt(t, alice, bob, fmt.Sprint("c1-", i))
		chain1 = append(chain1, msg{typ, ct, fmt.Sprint("c1-", i)})
	}
	// A ratchet step in between: the late messages belong to an older chain.
	typ, ct = mustEncrypt(t, bob, alice, "turn")
	mustDecrypt(t, alice, bob, typ, ct, "turn")
	for i := 0; i < 50; i++ {
		typ, ct := mustEncrypt(t, alice, bob, fmt.Sprint("c2-", i))
		chain2 = append(chain2, msg{typ, ct, fmt.Sprint("c2-", i)})
	}
	// Newest first, both chains interleaved backwards.
	for i := 49; i >= 0; i-- {
		mustDecrypt(t, bob, alice, chain2[i].typ, chain2[i].ct, chain2[i].txt)
		mustDecrypt(t, bob, alice, chain1[i].typ, chain1[i].ct, chain1[i].txt)
	}
}

func TestBeyondLimitsFailCleanly(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	start(t, alice, bob, true, true)
	typ, ct := mustEncrypt(t, alice, bob, "start")
	mustDecrypt(t, bob, alice, typ, ct, "start")
	typ, ct = mustEncrypt(t, bob, alice, "ack")
	mustDecrypt(t, alice, bob, typ, ct, "ack")

	// More skipped keys than kept: the oldest are dropped and fail cleanly
	// as duplicates; the newer ones still open.
	var msgs [][]byte
	for i := 0; i < MaxSkippedKeys+100; i++ {
		_, ct := mustEncrypt(t, alice, bob, fmt.Sprint(i))
		msgs = append(msgs, ct)
	}
	last := len(msgs) - 1
	mustDecrypt(t, bob, alice, TypeSignal, msgs[last], fmt.Sprint(last))
	if _, err := bob.Decrypt(alice.Address(), TypeSignal, msgs[0]); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("message whose skipped key was dropped: %v", err)
	}
	mustDecrypt(t, bob, alice, TypeSignal, msgs[150], "150")

	// A jump over MaxForwardJump is refused and changes nothing.
	advanceSending(t, alice, bob.Address(), MaxForwardJump+1) // as if that many were sent
	_, far := mustEncrypt(t, alice, bob, "far")
	before := bob.st.Snapshot()
	if _, err := bob.Decrypt(alice.Address(), TypeSignal, far); !errors.Is(err, ErrTooFarAhead) {
		t.Fatalf("message %d ahead: %v", MaxForwardJump+2, err)
	}
	if !reflect.DeepEqual(before.m, bob.st.Snapshot().m) {
		t.Fatal("a refused message changed the stored state")
	}
}

func TestFailedDecryptLeavesSessionUnchanged(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	start(t, alice, bob, true, true)
	typ, ct := mustEncrypt(t, alice, bob, "start")
	mustDecrypt(t, bob, alice, typ, ct, "start")
	typ, ct = mustEncrypt(t, bob, alice, "ack")
	mustDecrypt(t, alice, bob, typ, ct, "ack")

	_, good := mustEncrypt(t, alice, bob, "genuine")
	for _, tamper := range []func([]byte) []byte{
		func(b []byte) []byte { b[len(b)-1] ^= 1; return b },  // MAC
		func(b []byte) []byte { b[len(b)-12] ^= 1; return b }, // ciphertext
		func(b []byte) []byte { return b[:len(b)-3] },         // truncated
	} {
		before := bob.st.Snapshot()
		if _, err := bob.Decrypt(alice.Address(), TypeSignal, tamper(bytes.Clone(good))); err == nil {
			t.Fatal("a tampered message decrypted")
		}
		if !reflect.DeepEqual(before.m, bob.st.Snapshot().m) {
			t.Fatal("a failed decryption changed the stored session")
		}
	}
	// A forged message on a new ratchet key (a DH step that would move the
	// state) must not move it either.
	forger := newTestDev(t, "mallory", "m")
	start(t, forger, bob, true, true)
	before := bob.st.Snapshot()
	_, forged := mustEncrypt(t, alice, bob, "x")
	m, _ := ParseSignalMessage(forged)
	m2 := newSignalMessage(m.Version, make([]byte, 32), GenerateKeyPair().Public, 0, 0, m.Ciphertext, alice.IdentityKey(), bob.IdentityKey())
	if _, err := bob.Decrypt(alice.Address(), TypeSignal, m2.Serialized); !errors.Is(err, ErrBadMAC) {
		t.Fatalf("forged ratchet step: %v", err)
	}
	if !reflect.DeepEqual(before.m, bob.st.Snapshot().m) {
		t.Fatal("a forged ratchet step changed the stored session")
	}
	mustDecrypt(t, bob, alice, TypeSignal, good, "genuine")
}

func TestSimultaneousInitiationConverges(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	start(t, alice, bob, true, true)
	start(t, bob, alice, true, true)
	at, act := mustEncrypt(t, alice, bob, "hi bob")
	bt, bct := mustEncrypt(t, bob, alice, "hi alice")
	if at != TypePreKey || bt != TypePreKey {
		t.Fatal("first messages are not PreKey messages")
	}
	mustDecrypt(t, bob, alice, at, act, "hi bob")
	mustDecrypt(t, alice, bob, bt, bct, "hi alice")
	// Each now sends on the session the other started; both converge.
	for i := 0; i < 5; i++ {
		typ, ct := mustEncrypt(t, alice, bob, fmt.Sprint("a", i))
		mustDecrypt(t, bob, alice, typ, ct, fmt.Sprint("a", i))
		typ, ct = mustEncrypt(t, bob, alice, fmt.Sprint("b", i))
		mustDecrypt(t, alice, bob, typ, ct, fmt.Sprint("b", i))
	}
	var ra, rb sessionRecord
	alice.load("session/"+bob.Address().String(), &ra)
	bob.load("session/"+alice.Address().String(), &rb)
	if ra.Current.BaseKey != rb.Current.BaseKey {
		t.Fatal("the two sides did not converge on one session")
	}
	typ, _ := mustEncrypt(t, alice, bob, "after")
	if typ != TypeSignal {
		t.Fatal("converged session still sends PreKey messages")
	}
}

func TestMissingOneTimePreKeyStillWorks(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	start(t, alice, bob, false, true) // the directory ran out of one-time keys
	typ, ct := mustEncrypt(t, alice, bob, "no one-time key")
	p, _ := ParsePreKeySignalMessage(ct)
	if p.HasPreKey {
		t.Fatal("message names a one-time prekey")
	}
	mustDecrypt(t, bob, alice, typ, ct, "no one-time key")
	// A message naming a one-time key that was already used is refused.
	carol := newTestDev(t, "carol", "c")
	b := bob.bundle(true, true)
	if err := carol.ProcessBundle(b); err != nil {
		t.Fatal(err)
	}
	dave := newTestDev(t, "dave", "d")
	if err := dave.ProcessBundle(b); err != nil { // the same bundle again
		t.Fatal(err)
	}
	typ, ct = mustEncrypt(t, carol, bob, "c")
	mustDecrypt(t, bob, carol, typ, ct, "c")
	typ, ct = mustEncrypt(t, dave, bob, "d")
	if _, err := bob.Decrypt(dave.Address(), typ, ct); !errors.Is(err, ErrInvalidPreKey) {
		t.Fatalf("reused one-time prekey: %v", err)
	}
}

func TestLowOrderBaseKeyRefused(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	start(t, alice, bob, true, true)
	_, ct := mustEncrypt(t, alice, bob, "x")
	p, _ := ParsePreKeySignalMessage(ct)
	p.BaseKey = PublicKey{} // the zero point: order 4
	p.encode()
	if _, err := bob.Decrypt(alice.Address(), TypePreKey, p.Serialized); !errors.Is(err, ErrLowOrderKey) {
		t.Fatalf("low-order base key: %v", err)
	}
}

// Forward secrecy: once a message is decrypted its key is gone from the
// stored state, so a later copy of the state cannot open it again.
func TestForwardSecrecy(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	start(t, alice, bob, true, true)
	typ, ct := mustEncrypt(t, alice, bob, "start")
	mustDecrypt(t, bob, alice, typ, ct, "start")
	var sent [][]byte
	for i := 0; i < 3; i++ {
		_, c := mustEncrypt(t, alice, bob, fmt.Sprint(i))
		sent = append(sent, c)
	}
	mustDecrypt(t, bob, alice, TypePreKey, sent[2], "2") // 0 and 1 are skipped keys now
	mustDecrypt(t, bob, alice, TypePreKey, sent[0], "0")
	stolen, err := OpenDevice(bob.st.Snapshot(), bob.Address())
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 2} {
		if _, err := stolen.Decrypt(alice.Address(), TypePreKey, sent[i]); !errors.Is(err, ErrDuplicate) {
			t.Fatalf("stolen state opened an already-read message %d: %v", i, err)
		}
	}
	// The one still unread opens (its skipped key is legitimately kept).
	if _, err := stolen.Decrypt(alice.Address(), TypePreKey, sent[1]); err != nil {
		t.Fatal(err)
	}
}

// Post-compromise security: an attacker with a copy of Bob's state follows
// the conversation until Bob's next DH ratchet step, then loses it.
func TestPostCompromiseRecovery(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	start(t, alice, bob, true, true)
	typ, ct := mustEncrypt(t, alice, bob, "start")
	mustDecrypt(t, bob, alice, typ, ct, "start")
	typ, ct = mustEncrypt(t, bob, alice, "ack")
	mustDecrypt(t, alice, bob, typ, ct, "ack")

	attacker, err := OpenDevice(bob.st.Snapshot(), bob.Address())
	if err != nil {
		t.Fatal(err)
	}
	// The next message is readable with the stolen state.
	_, m1 := mustEncrypt(t, alice, bob, "m1")
	if got, err := attacker.Decrypt(alice.Address(), TypeSignal, m1); err != nil || string(got) != "m1" {
		t.Fatalf("attacker could not read the next message: %q %v", got, err)
	}
	mustDecrypt(t, bob, alice, TypeSignal, m1, "m1")
	// Bob answers and Alice replies: Alice ratchets onto Bob's key, Bob then
	// ratchets to a fresh key the attacker never saw.
	_, r1 := mustEncrypt(t, bob, alice, "r1")
	mustDecrypt(t, alice, bob, TypeSignal, r1, "r1")
	_, m2 := mustEncrypt(t, alice, bob, "m2")
	attacker.Decrypt(alice.Address(), TypeSignal, m2) // keeps up as far as it can
	mustDecrypt(t, bob, alice, TypeSignal, m2, "m2")
	_, r2 := mustEncrypt(t, bob, alice, "r2") // on Bob's fresh ratchet key
	mustDecrypt(t, alice, bob, TypeSignal, r2, "r2")
	_, m3 := mustEncrypt(t, alice, bob, "m3")
	if _, err := attacker.Decrypt(alice.Address(), TypeSignal, m3); err == nil {
		t.Fatal("attacker read a message after the DH ratchet step")
	}
	mustDecrypt(t, bob, alice, TypeSignal, m3, "m3")
}

func TestFileStoreMode(t *testing.T) {
	dir := t.TempDir()
	fs, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := OpenDevice(fs, Address{"alice", "phone"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.GenerateKeys(2); err != nil {
		t.Fatal(err)
	}
	keys, _ := fs.List("")
	if len(keys) < 5 {
		t.Fatalf("keys %v", keys)
	}
	checkModes(t, dir)
	// Reopening gives the same identity.
	d2, err := OpenDevice(fs, Address{"alice", "phone"})
	if err != nil || d2.IdentityKey() != d.IdentityKey() {
		t.Fatal("identity not persisted")
	}
}

// advanceSending moves a session's sending chain n steps, as n Encrypt
// calls would (without their cost).
func advanceSending(t testing.TB, d *testDev, peer Address, n int) {
	t.Helper()
	var rec sessionRecord
	if ok, err := d.load("session/"+peer.String(), &rec); !ok || err != nil {
		t.Fatalf("no session: %v", err)
	}
	for i := 0; i < n; i++ {
		rec.Current.Sender.Chain = rec.Current.Sender.Chain.next()
	}
	if err := d.save("session/"+peer.String(), rec); err != nil {
		t.Fatal(err)
	}
}

func TestTrustStrictRefusesChangedIdentity(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	alice.SetTrustPolicy(TrustStrict)
	start(t, alice, bob, true, true)
	// Bob reinstalls: same address, new identity.
	bob2 := newTestDev(t, "bob", "b")
	if err := alice.ProcessBundle(bob2.bundle(true, true)); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("changed identity under TrustStrict: %v", err)
	}
	// After comparing safety numbers, the user accepts the new key.
	if err := alice.TrustIdentity(bob2.Address(), bob2.IdentityKey()); err != nil {
		t.Fatal(err)
	}
	start(t, alice, bob2, true, true)
	typ, ct := mustEncrypt(t, alice, bob2, "hello again")
	mustDecrypt(t, bob2, alice, typ, ct, "hello again")
	// The default (trust on first use) accepts the change and reports the new key.
	carol := newTestDev(t, "carol", "c")
	start(t, carol, bob, true, true)
	start(t, carol, bob2, true, true)
	if k, ok, _ := carol.PeerIdentity(bob.Address()); !ok || k != bob2.IdentityKey() {
		t.Fatal("TOFU did not record the new identity")
	}
}

func TestSignedPreKeyRotation(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	start(t, alice, bob, true, true) // on signed prekey 1
	typ, ct := mustEncrypt(t, alice, bob, "on the old signed prekey")
	spk, err := bob.RotateSignedPreKey()
	if err != nil || spk.ID != 2 || !bob.IdentityKey().Verify(spk.Key.Bytes(), spk.Sig) {
		t.Fatalf("rotation: %+v %v", spk, err)
	}
	// A session started on the old key still opens after the rotation.
	mustDecrypt(t, bob, alice, typ, ct, "on the old signed prekey")
	carol := newTestDev(t, "carol", "c")
	b := bob.bundle(true, true)
	b.SignedPreKey = spk
	if err := carol.ProcessBundle(b); err != nil {
		t.Fatal(err)
	}
	typ, ct = mustEncrypt(t, carol, bob, "on the new one")
	mustDecrypt(t, bob, carol, typ, ct, "on the new one")
	// Pruning keeps the newest: a new session on the old key then fails.
	if err := bob.PruneSignedPreKeys(1); err != nil {
		t.Fatal(err)
	}
	dave := newTestDev(t, "dave", "d")
	start(t, dave, bob, true, true) // the old bundle (signed prekey 1)
	typ, ct = mustEncrypt(t, dave, bob, "too late")
	if _, err := bob.Decrypt(dave.Address(), typ, ct); !errors.Is(err, ErrInvalidPreKey) {
		t.Fatalf("session on a pruned signed prekey: %v", err)
	}
}

// Sessions live in the Store: a device reopened from its files continues
// the conversation.
func TestSessionSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	fs, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := OpenDevice(fs, Address{"alice", "a"})
	if err != nil {
		t.Fatal(err)
	}
	alice := &testDev{Device: d}
	bob := newTestDev(t, "bob", "b")
	start(t, alice, bob, true, true)
	typ, ct := mustEncrypt(t, alice, bob, "before restart")
	mustDecrypt(t, bob, alice, typ, ct, "before restart")
	typ, ct = mustEncrypt(t, bob, alice, "while away")

	if err := fs.Close(); err != nil { // the process ends: its lock goes
		t.Fatal(err)
	}
	fs2, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := OpenDevice(fs2, Address{"alice", "a"})
	if err != nil {
		t.Fatal(err)
	}
	alice2 := &testDev{Device: d2}
	mustDecrypt(t, alice2, bob, typ, ct, "while away")
	typ, ct = mustEncrypt(t, alice2, bob, "after restart")
	if typ != TypeSignal {
		t.Fatalf("type %d after the answer", typ)
	}
	mustDecrypt(t, bob, alice2, typ, ct, "after restart")
	checkModes(t, dir)
	fs2.Close()
}
