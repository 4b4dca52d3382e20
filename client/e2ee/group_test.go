package e2ee

import (
	"errors"
	"fmt"
	"testing"
)

func distribute(t testing.TB, group string, sender *testDev, to []*testDev, f SenderKeyFormat) {
	t.Helper()
	skdm, err := sender.GroupDistribution(group, f)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range to {
		if err := r.ProcessGroupDistribution(group, sender.Address(), skdm, f); err != nil {
			t.Fatal(err)
		}
	}
}

func groupOpen(t testing.TB, r, sender *testDev, group string, ct []byte, f SenderKeyFormat, want string) {
	t.Helper()
	got, err := r.GroupDecrypt(group, sender.Address(), ct, f)
	if err != nil {
		t.Fatalf("%s: %v", r.Address(), err)
	}
	if string(got) != want {
		t.Fatalf("got %q want %q", got, want)
	}
}

func TestGroupSenderKeys(t *testing.T) {
	for _, f := range []SenderKeyFormat{FormatModern, FormatLegacy} {
		t.Run(fmt.Sprint("format", f), func(t *testing.T) {
			alice, bob, carol := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b"), newTestDev(t, "carol", "c")
			distribute(t, "g", alice, []*testDev{bob, carol}, f)
			var cts [][]byte
			for i := 0; i < 20; i++ {
				ct, err := alice.GroupEncrypt("g", []byte(fmt.Sprint("m", i)), f)
				if err != nil {
					t.Fatal(err)
				}
				cts = append(cts, ct)
			}
			// Bob in order, Carol backwards (out of order).
			for i := range cts {
				groupOpen(t, bob, alice, "g", cts[i], f, fmt.Sprint("m", i))
				groupOpen(t, carol, alice, "g", cts[len(cts)-1-i], f, fmt.Sprint("m", len(cts)-1-i))
			}
			if _, err := bob.GroupDecrypt("g", alice.Address(), cts[3], f); !errors.Is(err, ErrDuplicate) {
				t.Fatalf("duplicate group message: %v", err)
			}
			// A tampered message fails its signature and changes nothing.
			ct, _ := alice.GroupEncrypt("g", []byte("next"), f)
			bad := append([]byte(nil), ct...)
			bad[len(bad)-sigLen-3] ^= 1 // in the ciphertext
			if _, err := bob.GroupDecrypt("g", alice.Address(), bad, f); !errors.Is(err, ErrBadSignature) {
				t.Fatalf("tampered group message: %v", err)
			}
			groupOpen(t, bob, alice, "g", ct, f, "next")
		})
	}
}

func TestGroupTooFarAhead(t *testing.T) {
	alice, bob := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b")
	distribute(t, "g", alice, []*testDev{bob}, FormatModern)
	var rec senderKeyRecord
	alice.load(senderKeyKey("g", alice.Address()), &rec)
	for i := 0; i < MaxForwardJump+1; i++ { // as if that many were sent
		rec.States[0].Chain = rec.States[0].Chain.next()
	}
	alice.save(senderKeyKey("g", alice.Address()), rec)
	ct, _ := alice.GroupEncrypt("g", []byte("far"), FormatModern)
	if _, err := bob.GroupDecrypt("g", alice.Address(), ct, FormatModern); !errors.Is(err, ErrTooFarAhead) {
		t.Fatalf("group message too far ahead: %v", err)
	}
}

func TestGroupLateJoinerCannotReadEarlier(t *testing.T) {
	alice, bob, late := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b"), newTestDev(t, "late", "l")
	distribute(t, "g", alice, []*testDev{bob}, FormatModern)
	early, _ := alice.GroupEncrypt("g", []byte("before you came"), FormatModern)
	groupOpen(t, bob, alice, "g", early, FormatModern, "before you came")
	distribute(t, "g", alice, []*testDev{late}, FormatModern) // the current iteration
	if _, err := late.GroupDecrypt("g", alice.Address(), early, FormatModern); err == nil {
		t.Fatal("a late joiner read an earlier message")
	}
	now, _ := alice.GroupEncrypt("g", []byte("welcome"), FormatModern)
	groupOpen(t, late, alice, "g", now, FormatModern, "welcome")
	groupOpen(t, bob, alice, "g", now, FormatModern, "welcome")
}

func TestGroupRemovedMemberAfterRotation(t *testing.T) {
	alice, bob, gone := newTestDev(t, "alice", "a"), newTestDev(t, "bob", "b"), newTestDev(t, "gone", "g")
	distribute(t, "g", alice, []*testDev{bob, gone}, FormatModern)
	ct, _ := alice.GroupEncrypt("g", []byte("all three"), FormatModern)
	groupOpen(t, gone, alice, "g", ct, FormatModern, "all three")
	// gone is removed: Alice rotates and redistributes to the others only.
	if err := alice.RotateGroup("g"); err != nil {
		t.Fatal(err)
	}
	distribute(t, "g", alice, []*testDev{bob}, FormatModern)
	ct, _ = alice.GroupEncrypt("g", []byte("without you"), FormatModern)
	groupOpen(t, bob, alice, "g", ct, FormatModern, "without you")
	if _, err := gone.GroupDecrypt("g", alice.Address(), ct, FormatModern); !errors.Is(err, ErrNoSenderKey) {
		t.Fatalf("removed member after rotation: %v", err)
	}
}

// A 1,000-member group: one ciphertext per message, opened by every member.
func TestGroupThousandMembersOneCiphertext(t *testing.T) {
	const n = 1000
	alice := newTestDevLight(t, "alice", "a")
	members := make([]*testDev, n)
	for i := range members {
		members[i] = newTestDevLight(t, fmt.Sprint("u", i), "d")
	}
	distribute(t, "big", alice, members, FormatModern)
	ct, err := alice.GroupEncrypt("big", []byte("to everyone"), FormatModern)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseSenderKeyMessage(ct, FormatModern)
	if err != nil || len(ct) > 200 {
		t.Fatalf("one message of %d bytes: %v", len(ct), err)
	}
	_ = m
	for _, r := range members {
		groupOpen(t, r, alice, "big", ct, FormatModern, "to everyone")
	}
}

// newTestDevLight skips prekey generation (group-only tests).
func newTestDevLight(t testing.TB, user, device string) *testDev {
	d, err := OpenDevice(NewMemoryStore(), Address{user, device})
	if err != nil {
		t.Fatal(err)
	}
	return &testDev{Device: d}
}

func TestSafetyNumberKAT(t *testing.T) {
	a, _ := DecodePublicKey(unhex(t, "0506863bc66d02b40d27b8d49ca7c09e9239236f9d7d25d6fcca5ce13c7064d868"))
	b, _ := DecodePublicKey(unhex(t, "05f781b6fb32fed9ba1cf2de978d4d5da28dc34046ae814402b5c0dbd96fda907b"))
	const want = "300354477692869396892869876765458257569162576843440918079131"
	if got := SafetyNumber("+14152222222", a, "+14153333333", b); got != want {
		t.Fatalf("safety number %s, want libsignal's %s", got, want)
	}
	if got := SafetyNumber("+14153333333", b, "+14152222222", a); got != want {
		t.Fatalf("from the other side %s", got)
	}
}
