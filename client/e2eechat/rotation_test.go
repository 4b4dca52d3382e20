package e2eechat

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// lastResortIDs fetches bob/phone's bundle as d and returns its signed
// prekey and KEM prekey ids (bob has no one-time keys: the KEM prekey is
// his last-resort key).
func lastResortIDs(t *testing.T, d *dev, user string) (spk, kem uint32) {
	t.Helper()
	bs, err := d.c.FetchBundles(ctxT(t), user, "phone")
	if err != nil || len(bs) != 1 || bs[0].KEMPreKey == nil || !bs[0].KEMLastResort {
		t.Fatalf("bundle of %s: %+v %v", user, bs, err)
	}
	return bs[0].SignedPreKey.ID, bs[0].KEMPreKey.ID
}

// Maintain replaces the signed prekey and the last-resort KEM key on the
// server once they are older than Rotation.Every (Signal's clients: two
// days), keeps the old ones for Rotation.Grace (thirty days) so a first
// message sent on them before the rotation still opens, and drops them
// after; an upload that failed is retried by the next Maintain.
// On both store engines: the directory checks and replaces the rotated
// keys.
func TestMaintainRotatesPreKeys(t *testing.T) {
	if DefaultRotation.Every != 48*time.Hour || DefaultRotation.Grace != 30*24*time.Hour {
		t.Fatalf("default rotation %+v", DefaultRotation)
	}
	t.Run("pebble", func(t *testing.T) { testMaintainRotatesPreKeys(t, servertest.Start(t)) })
	t.Run("cassandra", func(t *testing.T) { testMaintainRotatesPreKeys(t, cassandraServer(t)) })
}

func testMaintainRotatesPreKeys(t *testing.T, srv *servertest.Server) {
	ctx := ctxT(t)
	clock := &testClock{t: time.Now()}
	bob := startDev(t, srv, "bob", "phone", 0)
	bob.m.Device().SetClock(clock.now)
	if _, err := bob.m.PublishKeys(ctx, 0); err != nil { // signed and last-resort keys only
		t.Fatal(err)
	}
	alice := startDev(t, srv, "alice", "phone", 3)
	carol := startDev(t, srv, "carol", "phone", 3)
	dave := startDev(t, srv, "dave", "phone", 3)
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	cconv, err := carol.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	dconv, err := dave.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	spk1, kem1 := lastResortIDs(t, alice, "bob")

	clock.advance(47 * time.Hour)
	if err := bob.m.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if spk, kem := lastResortIDs(t, alice, "bob"); spk != spk1 || kem != kem1 {
		t.Fatalf("rotated before two days: %d %d", spk, kem)
	}
	// Alice's first message, on the first keys, is in flight; dave holds
	// a session begun on them too.
	a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "sent before the rotation")
	if err != nil {
		t.Fatal(err)
	}
	if err := dave.m.ensureSession(ctx, e2ee.Address{User: "bob", Device: "phone"}); err != nil {
		t.Fatal(err)
	}

	clock.advance(2 * time.Hour)
	if err := bob.m.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	spk2, kem2 := lastResortIDs(t, carol, "bob")
	if spk2 == spk1 || kem2 == kem1 {
		t.Fatalf("not rotated after two days: signed prekey %d→%d, last-resort KEM %d→%d", spk1, spk2, kem1, kem2)
	}
	wantText(t, "bob", bob.read(t, conv.ConvID), a1.Seq, "sent before the rotation")
	c1, err := carol.m.SendDirect(ctx, cconv.ConvID, "bob", "on the new keys")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "bob", bob.read(t, cconv.ConvID), c1.Seq, "on the new keys")

	// Past the grace period the first keys are gone: dave's session begun
	// on them a month ago no longer reaches bob.
	clock.advance(30*24*time.Hour + time.Minute)
	if err := bob.m.Maintain(ctx); err != nil { // rotates again, prunes the first keys
		t.Fatal(err)
	}
	d1, err := dave.m.SendDirect(ctx, dconv.ConvID, "bob", "on keys a month old")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range bob.history(t, dconv.ConvID) {
		if m.Seq == d1.Seq {
			if _, err := bob.m.Open(m); !errors.Is(err, e2ee.ErrInvalidPreKey) {
				t.Fatalf("first message on pruned keys: %v, want e2ee.ErrInvalidPreKey", err)
			}
		}
	}

	// The directory takes rotated keys only signed by the device's
	// identity.
	spk, lr, err := bob.m.Device().CurrentPreKeys()
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := e2ee.OpenDevice(e2ee.NewMemoryStore(), e2ee.Address{User: "mallory", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	forged, err := mallory.GenerateKeys(0)
	if err != nil {
		t.Fatal(err)
	}
	for name, up := range map[string]protocol.KeyUpload{
		"signed prekey":       {SignedPreKey: &protocol.PreKey{ID: spk.ID + 100, Key: forged.SignedPreKey.Key.Bytes(), Sig: forged.SignedPreKey.Sig}},
		"last-resort KEM key": {LastResortKEM: &protocol.PreKey{ID: lr.ID + 100, Key: forged.LastResortKEM.Key, Sig: forged.LastResortKEM.Sig}},
	} {
		if _, err := bob.c.UploadKeys(ctx, up); code(err) != protocol.CodeBadKey {
			t.Errorf("%s signed by another identity: %v, want bad_key", name, err)
		}
	}
	if s, k := lastResortIDs(t, carol, "bob"); s != spk.ID || k != lr.ID {
		t.Fatalf("after refused uploads the bundle has %d %d, want %d %d", s, k, spk.ID, lr.ID)
	}

	// An upload that fails leaves the new keys to be uploaded by the next
	// Maintain, even though they are not due any more.
	spk3, kem3 := lastResortIDs(t, carol, "bob")
	clock.advance(49 * time.Hour)
	// The same device behind a client that never connects: its upload
	// cannot reach the server.
	offline, err := client.New(client.Config{URL: srv.URL, Token: srv.Token("bob"), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	defer offline.Close()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := New(offline, bob.m.Device(), bob.st).Maintain(short); err == nil {
		t.Fatal("Maintain without a connection succeeded")
	}
	if spk, kem := lastResortIDs(t, carol, "bob"); spk != spk3 || kem != kem3 {
		t.Fatalf("the server has keys whose upload failed: %d %d", spk, kem)
	}
	if err := bob.m.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if spk, kem := lastResortIDs(t, carol, "bob"); spk == spk3 || kem == kem3 {
		t.Fatalf("keys not uploaded after a failed upload: %d %d", spk, kem)
	}
}

func TestSetRotationValidates(t *testing.T) {
	st := e2ee.NewMemoryStore()
	d, err := e2ee.OpenDevice(st, e2ee.Address{User: "bob", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	m := New(nil, d, st)
	for _, r := range []Rotation{{Every: -time.Hour}, {Grace: -time.Hour}} {
		if err := m.SetRotation(r); err == nil {
			t.Errorf("SetRotation(%+v) accepted", r)
		}
	}
	if err := m.SetRotation(Rotation{}); err != nil || m.rotation() != DefaultRotation {
		t.Fatalf("zero Rotation: %+v %v", m.rotation(), err)
	}
	if err := m.SetRotation(Rotation{Every: time.Hour}); err != nil || m.rotation() != (Rotation{Every: time.Hour, Grace: DefaultRotation.Grace}) {
		t.Fatalf("partial Rotation: %+v %v", m.rotation(), err)
	}
}
