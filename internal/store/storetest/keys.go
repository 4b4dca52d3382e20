package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

func upload(id, spk uint32, n, from int) store.KeyUpload {
	up := store.KeyUpload{
		RegistrationID: 7,
		IdentityKey:    bytes.Repeat([]byte{byte(id)}, 33),
		AccountKey:     []byte("account-a"),
		DeviceSig:      []byte(fmt.Sprint("cert", id)),
		SignedPreKey:   &store.PreKey{ID: spk, Key: []byte(fmt.Sprint("spk", spk)), Sig: []byte("sig")},
		LastResortKEM:  &store.PreKey{ID: 1000, Key: []byte("last-resort"), Sig: []byte("lrsig")},
		Now:            1,
	}
	for i := 0; i < n; i++ {
		up.PreKeys = append(up.PreKeys, store.PreKey{ID: uint32(from + i), Key: []byte(fmt.Sprint("pk", from+i))})
		up.KEMPreKeys = append(up.KEMPreKeys, store.PreKey{ID: uint32(from + i), Key: []byte(fmt.Sprint("kem", from+i)), Sig: []byte("s")})
	}
	return up
}

func testKeyDirectory(t *testing.T, e *env) {
	ctx := context.Background()
	s := e.s
	if _, err := s.TakeBundle(ctx, "alice", "phone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("bundle of an unknown device: %v", err)
	}
	if _, err := s.UploadKeys(ctx, "alice", "phone", store.KeyUpload{PreKeys: []store.PreKey{{ID: 1}}}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("partial first upload: %v", err)
	}
	res, err := s.UploadKeys(ctx, "alice", "phone", upload(1, 1, 3, 1))
	if err != nil {
		t.Fatal(err)
	}
	if !res.NewDevice || res.IdentityChanged || res.PreKeys != 3 || res.KEMPreKeys != 3 {
		t.Fatalf("first upload: %+v", res)
	}
	if _, err := s.UploadKeys(ctx, "alice", "laptop", upload(2, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	devs, err := s.KeyDevices(ctx, "alice")
	if err != nil || len(devs) != 2 || devs[0].DeviceID != "laptop" || devs[1].DeviceID != "phone" {
		t.Fatalf("devices %+v %v", devs, err)
	}
	if devs[1].RegistrationID != 7 || devs[1].SignedPreKey.ID != 1 || string(devs[1].LastResortKEM.Key) != "last-resort" ||
		string(devs[1].AccountKey) != "account-a" || string(devs[1].DeviceSig) != "cert1" {
		t.Fatalf("device row %+v", devs[1])
	}
	// Bundles hand out one-time keys lowest id first, each once; then the
	// last-resort KEM key and no Curve25519 one-time key.
	for i := 1; i <= 4; i++ {
		b, err := s.TakeBundle(ctx, "alice", "phone")
		if err != nil {
			t.Fatal(err)
		}
		if i <= 3 {
			if b.PreKey == nil || b.PreKey.ID != uint32(i) || string(b.PreKey.Key) != fmt.Sprint("pk", i) ||
				b.KEMPreKey == nil || b.KEMPreKey.ID != uint32(i) || b.KEMLastResort || b.PreKeys != 3-i || b.KEMPreKeys != 3-i {
				t.Fatalf("bundle %d: %+v", i, b)
			}
		} else if b.PreKey != nil || !b.KEMLastResort || b.KEMPreKey.ID != 1000 {
			t.Fatalf("bundle after running out: %+v", b)
		}
		if !bytes.Equal(b.Device.IdentityKey, bytes.Repeat([]byte{1}, 33)) || string(b.Device.SignedPreKey.Key) != "spk1" ||
			string(b.Device.AccountKey) != "account-a" || string(b.Device.DeviceSig) != "cert1" {
			t.Fatalf("bundle device %+v", b.Device)
		}
	}
	// Rotating the signed prekey keeps the rest; refilling adds.
	res, err = s.UploadKeys(ctx, "alice", "phone", store.KeyUpload{
		SignedPreKey: &store.PreKey{ID: 2, Key: []byte("spk2"), Sig: []byte("sig2")},
		PreKeys:      []store.PreKey{{ID: 10, Key: []byte("pk10")}}, Now: 2})
	if err != nil || res.NewDevice || res.IdentityChanged || res.PreKeys != 1 || res.KEMPreKeys != 0 || res.Device.SignedPreKey.ID != 2 ||
		string(res.Device.AccountKey) != "account-a" || string(res.Device.DeviceSig) != "cert1" {
		t.Fatalf("rotation: %+v %v", res, err)
	}
	if a, k, err := s.PreKeyCounts(ctx, "alice", "phone"); err != nil || a != 1 || k != 0 {
		t.Fatalf("counts %d %d %v", a, k, err)
	}
	// Uploading an id again replaces the key; it is not counted twice.
	res, err = s.UploadKeys(ctx, "alice", "phone", store.KeyUpload{PreKeys: []store.PreKey{{ID: 10, Key: []byte("pk10b")}, {ID: 11, Key: []byte("pk11")}, {ID: 11, Key: []byte("pk11")}}, Now: 3})
	if err != nil || res.PreKeys != 2 {
		t.Fatalf("re-upload: %+v %v", res, err)
	}
	if b, err := s.TakeBundle(ctx, "alice", "phone"); err != nil || b.PreKey == nil || b.PreKey.ID != 10 || string(b.PreKey.Key) != "pk10b" || b.PreKeys != 1 {
		t.Fatalf("bundle after re-upload: %+v %v", b, err)
	}
	// Rotating the last-resort KEM key alone replaces it in the bundles
	// and keeps the signed prekey and the one-time keys.
	res, err = s.UploadKeys(ctx, "alice", "phone", store.KeyUpload{
		LastResortKEM: &store.PreKey{ID: 1001, Key: []byte("last-resort-2"), Sig: []byte("lrsig2")}, Now: 4})
	if err != nil || res.NewDevice || res.IdentityChanged || res.PreKeys != 1 || res.Device.SignedPreKey.ID != 2 ||
		res.Device.LastResortKEM.ID != 1001 || string(res.Device.LastResortKEM.Key) != "last-resort-2" {
		t.Fatalf("last-resort rotation: %+v %v", res, err)
	}
	if b, err := s.TakeBundle(ctx, "alice", "phone"); err != nil || b.PreKey == nil || b.PreKey.ID != 11 ||
		!b.KEMLastResort || b.KEMPreKey == nil || b.KEMPreKey.ID != 1001 || string(b.KEMPreKey.Sig) != "lrsig2" ||
		b.Device.SignedPreKey.ID != 2 {
		t.Fatalf("bundle after the last-resort rotation: %+v %v", b, err)
	}
	// A new identity drops the prekeys signed by the old one and carries
	// its own certificate.
	res, err = s.UploadKeys(ctx, "alice", "phone", upload(9, 3, 0, 0))
	if err != nil || !res.IdentityChanged || res.PreKeys != 0 || string(res.Device.DeviceSig) != "cert9" {
		t.Fatalf("identity change: %+v %v", res, err)
	}
	// A new account key and certificate replace the stored ones.
	res, err = s.UploadKeys(ctx, "alice", "laptop", store.KeyUpload{AccountKey: []byte("account-b"), DeviceSig: []byte("cert2b"), Now: 4})
	if err != nil || res.IdentityChanged || string(res.Device.AccountKey) != "account-b" || string(res.Device.DeviceSig) != "cert2b" {
		t.Fatalf("account change: %+v %v", res, err)
	}
	if err := s.RemoveDevice(ctx, "alice", "phone"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TakeBundle(ctx, "alice", "phone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("bundle of a removed device: %v", err)
	}
	if devs, _ := s.KeyDevices(ctx, "alice"); len(devs) != 1 {
		t.Fatalf("devices after removal: %+v", devs)
	}
	e.reopen(t)
	if devs, _ := e.s.KeyDevices(ctx, "alice"); len(devs) != 1 || devs[0].DeviceID != "laptop" ||
		string(devs[0].AccountKey) != "account-b" || string(devs[0].DeviceSig) != "cert2b" {
		t.Fatalf("devices after reopen: %+v", devs)
	}
	// A device uploaded without an account key (before account keys) has
	// none.
	legacy := upload(4, 1, 0, 0)
	legacy.AccountKey, legacy.DeviceSig = nil, nil
	if _, err := e.s.UploadKeys(ctx, "carol", "old", legacy); err != nil {
		t.Fatal(err)
	}
	if devs, _ := e.s.KeyDevices(ctx, "carol"); len(devs) != 1 || len(devs[0].AccountKey) != 0 || len(devs[0].DeviceSig) != 0 {
		t.Fatalf("legacy device: %+v", devs)
	}
}

// Concurrent fetches never hand out one one-time key twice.
func testKeyDirectoryConcurrent(t *testing.T, e *env) {
	ctx := context.Background()
	const keys, takers = 40, 8
	if _, err := e.s.UploadKeys(ctx, "bob", "d", upload(3, 1, keys, 1)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[uint32]int{}
	seenKEM := map[uint32]int{}
	var wg sync.WaitGroup
	errs := make(chan error, takers)
	for g := 0; g < takers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < keys/takers+2; i++ {
				b, err := e.s.TakeBundle(ctx, "bob", "d")
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if b.PreKey != nil {
					seen[b.PreKey.ID]++
				}
				if !b.KEMLastResort {
					seenKEM[b.KEMPreKey.ID]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != keys || len(seenKEM) != keys {
		t.Fatalf("%d prekeys and %d KEM prekeys handed out, want %d each", len(seen), len(seenKEM), keys)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("prekey %d handed out %d times", id, n)
		}
	}
	for id, n := range seenKEM {
		if n != 1 {
			t.Fatalf("KEM prekey %d handed out %d times", id, n)
		}
	}
}

// End-to-end conversations: the flag is stored and never lost, and a pair
// has distinct plaintext and E2E direct conversations.
func testE2EConversations(t *testing.T, e *env) {
	ctx := context.Background()
	if err := e.s.CreateConversation(ctx, store.Conversation{ID: 500, Kind: store.Group, Name: "secret", CreatedAt: 1, E2E: true},
		[]store.Member{{UserID: "a", Role: store.RoleOwner}, {UserID: "b"}}); err != nil {
		t.Fatal(err)
	}
	plain, err := e.s.Direct(ctx, "a", "b", 501, 1)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := e.s.DirectE2E(ctx, "b", "a", 502, 1)
	if err != nil {
		t.Fatal(err)
	}
	if plain.ID != 501 || plain.E2E || enc.ID != 502 || !enc.E2E || enc.Kind != store.Direct {
		t.Fatalf("direct %+v, E2E direct %+v", plain, enc)
	}
	again, err := e.s.DirectE2E(ctx, "a", "b", 503, 2)
	if err != nil || again.ID != 502 || !again.E2E {
		t.Fatalf("E2E direct again: %+v %v", again, err)
	}
	if again, err := e.s.Direct(ctx, "b", "a", 504, 2); err != nil || again.ID != 501 || again.E2E {
		t.Fatalf("direct again: %+v %v", again, err)
	}
	e.send(t, 500, "a", 2)
	e.send(t, 502, "b", 1)
	if _, err := e.s.AddMembers(ctx, 500, []string{"c"}, store.RoleMember); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetTier(ctx, 500, 2); err != nil {
		t.Fatal(err)
	}
	e.reopen(t)
	for _, id := range []uint64{500, 502} {
		c, err := e.s.Conversation(ctx, id)
		if err != nil || !c.E2E {
			t.Fatalf("conversation %d after writes and reopen: %+v %v", id, c, err)
		}
	}
	if c, err := e.s.Conversation(ctx, 501); err != nil || c.E2E {
		t.Fatalf("plaintext direct after reopen: %+v %v", c, err)
	}
}
