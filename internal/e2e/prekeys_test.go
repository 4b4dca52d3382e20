package e2e

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/schema"
)

// testAccounts holds each test user's account key: a user's devices
// share it, as devices linked to one account do.
var testAccounts sync.Map // "<test>/<user>" → exported account key

// publishKeys uploads n one-time prekeys of each kind for c's device,
// signed by a real identity key and certified by its user's account key,
// in uploads that fit the frame limits.
func publishKeys(t *testing.T, c *rawConn, user, device string, n int) {
	t.Helper()
	d, err := e2ee.OpenDevice(e2ee.NewMemoryStore(), e2ee.Address{User: user, Device: device})
	if err != nil {
		t.Fatal(err)
	}
	up, err := d.GenerateKeys(n)
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := testAccounts.Load(t.Name() + "/" + user); ok {
		_, err = d.ImportAccountKey(b.([]byte))
	} else if _, err = d.CreateAccountKey(); err == nil {
		b, _ := d.ExportAccountKey()
		testAccounts.Store(t.Name()+"/"+user, b)
	}
	if err != nil {
		t.Fatal(err)
	}
	ak, sig, err := d.DeviceCertificate()
	if err != nil {
		t.Fatal(err)
	}
	batch := protocol.KeyUpload{RegistrationID: up.RegistrationID, IdentityKey: up.IdentityKey.Bytes(), AccountKey: ak.Bytes(), DeviceSig: sig,
		SignedPreKey:  &protocol.PreKey{ID: up.SignedPreKey.ID, Key: up.SignedPreKey.Key.Bytes(), Sig: up.SignedPreKey.Sig},
		LastResortKEM: &protocol.PreKey{ID: up.LastResortKEM.ID, Key: up.LastResortKEM.Key, Sig: up.LastResortKEM.Sig}}
	for len(up.PreKeys) > 0 || len(up.KEMPreKeys) > 0 {
		for len(up.PreKeys) > 0 && len(batch.PreKeys) < protocol.MaxUploadKEMPreKeys {
			batch.PreKeys = append(batch.PreKeys, protocol.PreKey{ID: up.PreKeys[0].ID, Key: up.PreKeys[0].Key.Bytes()})
			up.PreKeys = up.PreKeys[1:]
		}
		for len(up.KEMPreKeys) > 0 && len(batch.KEMPreKeys) < protocol.MaxUploadKEMPreKeys {
			p := up.KEMPreKeys[0]
			batch.KEMPreKeys = append(batch.KEMPreKeys, protocol.PreKey{ID: p.ID, Key: p.Key, Sig: p.Sig})
			up.KEMPreKeys = up.KEMPreKeys[1:]
		}
		mustOK(t, c.call(protocol.Frame{Type: protocol.TypeKeysUpload, Keys: &batch}), protocol.TypeKeys)
		batch = protocol.KeyUpload{}
	}
}

// countOneTime counts the one-time prekeys of each kind in a bundles
// answer for one device, failing on any other answer or on a bundle a
// session cannot start from.
func countOneTime(t *testing.T, f *protocol.Frame) (pre, kem int) {
	t.Helper()
	mustOK(t, f, protocol.TypeBundles)
	if len(f.Bundles) != 1 {
		t.Fatalf("bundles answer with %d bundles; want 1", len(f.Bundles))
	}
	b := f.Bundles[0]
	if len(b.SignedPreKey.Key) == 0 || b.KEMPreKey == nil || b.Limited && (b.PreKey != nil || !b.KEMLastResort) {
		t.Fatalf("bundle a session cannot start from, or a limited one with one-time keys: %+v", b)
	}
	if b.PreKey != nil {
		pre = 1
	}
	if !b.KEMLastResort {
		kem = 1
	}
	return pre, kem
}

// TestPrekeyDrainOverWire plays the attacker against a real node: a
// stranger opens a direct conversation with the victim (no consent
// needed) and fetches the victim device's bundle in a loop, over one
// WebSocket and over /v1/rpc. Each takes at most chat.prekeys_per_device
// one-time keys of each kind; every other answer is a limited bundle.
func TestPrekeyDrainOverWire(t *testing.T) {
	srv := servertest.Start(t)
	bound := chat.DefaultConfig().PrekeysPerDevice
	const stored, tries = 100, 100
	for _, v := range []string{"victim-ws", "victim-rpc"} {
		publishKeys(t, dialRaw(t, srv, v, "d"), v, "d", stored)
	}

	ws := dialRaw(t, srv, "mallory", "m")
	ws.openDirect("victim-ws")
	start := time.Now()
	pre, kem := 0, 0
	for range tries {
		p, k := countOneTime(t, ws.call(protocol.Frame{Type: protocol.TypeKeysBundle, UserID: "victim-ws", DeviceID: "d"}))
		pre, kem = pre+p, kem+k
	}
	t.Logf("WebSocket: %d fetches in %v took %d Curve25519 and %d ML-KEM one-time prekeys of %d", tries, time.Since(start), pre, kem, stored)
	if pre != bound || kem != bound {
		t.Errorf("over a WebSocket a stranger took %d Curve25519 and %d ML-KEM one-time prekeys in %d fetches; want %d", pre, kem, tries, bound)
	}

	rpc := &pollClient{t: t, base: srv.HTTPURL, token: srv.Token("trudy")}
	do := func(f protocol.Frame) *protocol.Frame {
		t.Helper()
		body, _ := json.Marshal(f)
		st, out := rpc.do("POST", "/v1/rpc?device=t", body)
		if st != http.StatusOK {
			t.Fatalf("/v1/rpc %s: %d %s", f.Type, st, out)
		}
		if err := schema.ServerFrame(out); err != nil {
			t.Fatalf("/v1/rpc answer %s does not match protocol/schema/frames.json: %v", out, err)
		}
		var r protocol.Frame
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	mustOK(t, do(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "victim-rpc"}), protocol.TypeConv)
	start = time.Now()
	pre, kem = 0, 0
	for range tries {
		p, k := countOneTime(t, do(protocol.Frame{Type: protocol.TypeKeysBundle, UserID: "victim-rpc", DeviceID: "d"}))
		pre, kem = pre+p, kem+k
	}
	t.Logf("/v1/rpc: %d fetches in %v took %d Curve25519 and %d ML-KEM one-time prekeys of %d", tries, time.Since(start), pre, kem, stored)
	if pre != bound || kem != bound {
		t.Errorf("over /v1/rpc a stranger took %d Curve25519 and %d ML-KEM one-time prekeys in %d fetches; want %d", pre, kem, tries, bound)
	}
}
