package e2eechat

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

func code(err error) protocol.Code {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ""
}

// The key directory through the frames: signatures checked, access
// limited to contacts, one-time keys handed out once (also concurrently),
// keys_low when they run low, device and identity events.
func TestKeyDirectoryFrames(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 0)
	bob := startDev(t, srv, "bob", "phone", 0)
	mallory := startDev(t, srv, "mallory", "phone", 0)

	up, err := bob.m.Device().GenerateKeys(12)
	if err != nil {
		t.Fatal(err)
	}
	ak, sig, err := bob.m.Device().DeviceCertificate()
	if err != nil {
		t.Fatal(err)
	}
	toFrame := func(up e2ee.KeyUpload) protocol.KeyUpload {
		k := protocol.KeyUpload{RegistrationID: up.RegistrationID, IdentityKey: up.IdentityKey.Bytes(), AccountKey: ak.Bytes(), DeviceSig: sig,
			SignedPreKey:  &protocol.PreKey{ID: up.SignedPreKey.ID, Key: up.SignedPreKey.Key.Bytes(), Sig: up.SignedPreKey.Sig},
			LastResortKEM: &protocol.PreKey{ID: up.LastResortKEM.ID, Key: up.LastResortKEM.Key, Sig: up.LastResortKEM.Sig}}
		for _, p := range up.PreKeys {
			k.PreKeys = append(k.PreKeys, protocol.PreKey{ID: p.ID, Key: p.Key.Bytes()})
		}
		for _, p := range up.KEMPreKeys {
			k.KEMPreKeys = append(k.KEMPreKeys, protocol.PreKey{ID: p.ID, Key: p.Key, Sig: p.Sig})
		}
		return k
	}
	// A bad signed-prekey signature is refused, so is a first upload
	// without the identity, and a KEM key signed by someone else.
	bad := toFrame(up)
	bad.SignedPreKey.Sig = bytes.Clone(bad.SignedPreKey.Sig)
	bad.SignedPreKey.Sig[3] ^= 1
	if _, err := bob.c.UploadKeys(ctx, bad); code(err) != protocol.CodeBadKey {
		t.Fatalf("bad signature: %v", err)
	}
	if _, err := bob.c.UploadKeys(ctx, protocol.KeyUpload{PreKeys: toFrame(up).PreKeys}); code(err) != protocol.CodeInvalidArgument {
		t.Fatalf("first upload without identity: %v", err)
	}
	uncertified := toFrame(up)
	uncertified.AccountKey, uncertified.DeviceSig = nil, nil
	if _, err := bob.c.UploadKeys(ctx, uncertified); code(err) != protocol.CodeInvalidArgument {
		t.Fatalf("first upload without the account key's certificate: %v", err)
	}
	other, _ := mallory.m.Device().GenerateKeys(1)
	bad = toFrame(up)
	bad.KEMPreKeys = append(bad.KEMPreKeys, protocol.PreKey{ID: 999, Key: other.KEMPreKeys[0].Key, Sig: other.KEMPreKeys[0].Sig})
	if _, err := bob.c.UploadKeys(ctx, bad); code(err) != protocol.CodeBadKey {
		t.Fatalf("KEM key signed by another identity: %v", err)
	}
	counts, err := bob.c.UploadKeys(ctx, toFrame(up))
	if err != nil || counts.PreKeys != 12 || counts.KEMPreKeys != 12 {
		t.Fatalf("upload: %+v %v", counts, err)
	}

	// Strangers get nothing; contacts do.
	if _, err := mallory.c.FetchBundles(ctx, "bob", ""); code(err) != protocol.CodeForbidden {
		t.Fatalf("stranger fetch: %v", err)
	}
	if _, err := mallory.c.KeyDevices(ctx, "bob"); code(err) != protocol.CodeForbidden {
		t.Fatalf("stranger device list: %v", err)
	}
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	devs, err := alice.c.KeyDevices(ctx, "bob")
	if err != nil || len(devs) != 1 || devs[0].DeviceID != "phone" || !bytes.Equal(devs[0].IdentityKey, up.IdentityKey.Bytes()) {
		t.Fatalf("devices %+v %v", devs, err)
	}

	// Concurrent fetches: every one-time key once; then keys_low.
	var mu sync.Mutex
	seen := map[uint32]int{}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 4; i++ {
				bs, err := alice.c.FetchBundles(ctx, "bob", "phone")
				if err != nil || len(bs) != 1 {
					t.Errorf("fetch: %v", err)
					return
				}
				mu.Lock()
				if bs[0].PreKey != nil {
					seen[bs[0].PreKey.ID]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != 12 {
		t.Fatalf("%d distinct one-time keys handed out, want 12: %v", len(seen), seen)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("one-time key %d handed out %d times", id, n)
		}
	}
	// Bob's device heard that its one-time keys ran low.
	select {
	case low := <-bob.keysLow:
		if low.DeviceID != "phone" || low.PreKeys >= protocol.KeysLowThreshold {
			t.Fatalf("keys_low %+v", low)
		}
	case <-ctx.Done():
		t.Fatal("no keys_low push")
	}
	bs, err := alice.c.FetchBundles(ctx, "bob", "phone")
	if err != nil || bs[0].PreKey != nil || !bs[0].KEMLastResort || bs[0].KEMPreKey == nil {
		t.Fatalf("bundle after running out: %+v %v", bs, err)
	}
	// A bundle without one-time keys still starts a session.
	b, err := bundleFrom(bs[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.m.Device().ProcessBundle(b); err != nil {
		t.Fatal(err)
	}

	// A new identity for bob's phone: contacts get identity_changed.
	st := e2ee.NewMemoryStore()
	fresh, _ := e2ee.OpenDevice(st, e2ee.Address{User: "bob", Device: "phone"})
	up2, _ := fresh.GenerateKeys(1)
	k2 := toFrame(up2)
	if _, err := bob.c.UploadKeys(ctx, k2); code(err) != protocol.CodeBadKey {
		t.Fatalf("a new identity with the old identity's certificate: %v", err)
	}
	shareAccount(t, srv, fresh)
	_, sig2, err := fresh.DeviceCertificate()
	if err != nil {
		t.Fatal(err)
	}
	k2.DeviceSig = sig2
	if _, err := bob.c.UploadKeys(ctx, k2); err != nil {
		t.Fatal(err)
	}
	hist, _, err := alice.c.History(ctx, conv.ConvID, client.HistoryQuery{Forward: true, Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range hist {
		if m.Kind == protocol.KindSystem && strings.Contains(m.Body, `"identity_changed"`) {
			found = true
		}
	}
	if !found {
		t.Fatalf("no identity_changed event in %+v", hist)
	}
}

// A reinstalled device (same id, new identity): contacts see
// identity_changed, drop the old session, and reach the new install.
func TestIdentityChangeRecovers(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 3)
	bob := startDev(t, srv, "bob", "phone", 3)
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "before")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "bob", bob.read(t, conv.ConvID), a1.Seq, "before")
	// Bob reinstalls: new state, same device id, new keys.
	bob2 := startDev(t, srv, "bob", "phone", 3)
	alice.read(t, conv.ConvID) // sees identity_changed
	a2, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "after reinstall")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "bob's new install", bob2.read(t, conv.ConvID), a2.Seq, "after reinstall")
	// An empty upload tells a device its counts; Refill tops up.
	c, err := bob2.m.KeyCounts(ctx)
	if err != nil || c.PreKeys != 2 {
		t.Fatalf("counts %+v %v", c, err)
	}
	if c, err = bob2.m.Refill(ctx, 20); err != nil || c.PreKeys != 22 || c.KEMPreKeys != 22 {
		t.Fatalf("refill %+v %v", c, err)
	}
}
