package clustertest

import (
	"testing"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/protocol"
)

// TestPrekeyBoundAcrossChatProcesses: a stranger fetching a device's
// bundle in a loop through two gateways, its requests spread over two
// chat processes (a NATS queue group), gets chat.prekeys_per_device
// one-time prekeys in all: the bound is one bucket in Redis, not one per
// process.
func TestPrekeyBoundAcrossChatProcesses(t *testing.T) {
	c := Start(t, Options{Gateways: 2, Chats: 2})
	victim := dial(t, c, c.Gateways[0], "victim", "d")
	d, err := e2ee.OpenDevice(e2ee.NewMemoryStore(), e2ee.Address{User: "victim", Device: "d"})
	if err != nil {
		t.Fatal(err)
	}
	up, err := d.GenerateKeys(protocol.MaxUploadKEMPreKeys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateAccountKey(); err != nil {
		t.Fatal(err)
	}
	ak, sig, err := d.DeviceCertificate()
	if err != nil {
		t.Fatal(err)
	}
	k := protocol.KeyUpload{RegistrationID: up.RegistrationID, IdentityKey: up.IdentityKey.Bytes(), AccountKey: ak.Bytes(), DeviceSig: sig,
		SignedPreKey:  &protocol.PreKey{ID: up.SignedPreKey.ID, Key: up.SignedPreKey.Key.Bytes(), Sig: up.SignedPreKey.Sig},
		LastResortKEM: &protocol.PreKey{ID: up.LastResortKEM.ID, Key: up.LastResortKEM.Key, Sig: up.LastResortKEM.Sig}}
	for _, p := range up.PreKeys {
		k.PreKeys = append(k.PreKeys, protocol.PreKey{ID: p.ID, Key: p.Key.Bytes()})
	}
	for _, p := range up.KEMPreKeys {
		k.KEMPreKeys = append(k.KEMPreKeys, protocol.PreKey{ID: p.ID, Key: p.Key, Sig: p.Sig})
	}
	// A second upload, so the device holds more one-time keys than the
	// bound and every fetch past it could have taken one.
	must(t, victim.call(protocol.Frame{Type: protocol.TypeKeysUpload, Keys: &k}), protocol.TypeKeys)
	more, err := d.GenerateKeys(protocol.MaxUploadKEMPreKeys)
	if err != nil {
		t.Fatal(err)
	}
	k2 := protocol.KeyUpload{}
	for _, p := range more.PreKeys {
		k2.PreKeys = append(k2.PreKeys, protocol.PreKey{ID: p.ID, Key: p.Key.Bytes()})
	}
	for _, p := range more.KEMPreKeys {
		k2.KEMPreKeys = append(k2.KEMPreKeys, protocol.PreKey{ID: p.ID, Key: p.Key, Sig: p.Sig})
	}
	stored := must(t, victim.call(protocol.Frame{Type: protocol.TypeKeysUpload, Keys: &k2}), protocol.TypeKeys).KeyCounts.PreKeys

	attackers := []*ws{dial(t, c, c.Gateways[0], "mallory", "m"), dial(t, c, c.Gateways[1], "mallory", "m2")}
	must(t, attackers[0].call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "victim"}), protocol.TypeConv)
	const tries = 60
	pre, kem := 0, 0
	for i := range tries {
		b := must(t, attackers[i%2].call(protocol.Frame{Type: protocol.TypeKeysBundle, UserID: "victim", DeviceID: "d"}), protocol.TypeBundles).Bundles
		if len(b) != 1 || b[0].KEMPreKey == nil || b[0].Limited && b[0].PreKey != nil {
			t.Fatalf("bundles %+v; want one bundle a session starts from", b)
		}
		if b[0].PreKey != nil {
			pre++
		}
		if !b[0].KEMLastResort {
			kem++
		}
	}
	t.Logf("%d fetches over 2 chat processes took %d Curve25519 and %d ML-KEM one-time prekeys of %d", tries, pre, kem, stored)
	if bound := chat.DefaultConfig().PrekeysPerDevice; pre != bound || kem != bound {
		t.Fatalf("a stranger took %d Curve25519 and %d ML-KEM one-time prekeys through 2 chat processes; want %d", pre, kem, bound)
	}
}
