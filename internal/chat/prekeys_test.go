package chat

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/bus/local"
	"github.com/parley-im/parley/internal/cluster/limit"
	lpebble "github.com/parley-im/parley/internal/ledger/pebble"
	"github.com/parley-im/parley/internal/registry/memory"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/schema"
)

// prekeyRig is services on one real Pebble store whose victim device
// v/d has published n one-time prekeys of each kind.
type prekeyRig struct {
	t   *testing.T
	st  store.Store
	led *lpebble.Ledger
}

func newPrekeyRig(t *testing.T) *prekeyRig {
	t.Helper()
	st, err := pebble.Open(context.Background(), pebble.Config{Dir: "db", FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	led, err := lpebble.Open(lpebble.Config{Dir: "ledger", FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close() })
	return &prekeyRig{t: t, st: st, led: led}
}

func (r *prekeyRig) service(cfg Config, lim Limiter, node uint16) *Service {
	svc := newService(r.t, cfg, r.st, memory.New(), local.New(), r.led, node)
	if lim != nil {
		svc.limits = lim
	}
	return svc
}

// call runs f as c and returns the answer.
func call(t *testing.T, s *Service, c Caller, f *protocol.Frame) *protocol.Frame {
	t.Helper()
	var got *protocol.Frame
	s.Handle(context.Background(), c, f, func(r *protocol.Frame) { got = r })
	if got == nil {
		t.Fatalf("%s: no answer", f.Type)
	}
	return got
}

// publish uploads n one-time prekeys of each kind for c's device, signed
// by a real identity key, in uploads that fit the frame limits.
func publish(t *testing.T, s *Service, c Caller, n int) {
	t.Helper()
	d, err := e2ee.OpenDevice(e2ee.NewMemoryStore(), e2ee.Address{User: c.User, Device: c.Device})
	if err != nil {
		t.Fatal(err)
	}
	up, err := d.GenerateKeys(n)
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
		if got := call(t, s, c, &protocol.Frame{Type: protocol.TypeKeysUpload, Keys: &batch}); got.Type != protocol.TypeKeys {
			t.Fatalf("keys_upload answered %s %s", got.Code, got.Error)
		}
		batch = protocol.KeyUpload{}
	}
}

// drain plays the attacker: open_direct with the victim (no consent
// needed), then keys_bundle for v/d tries times, round robin over ss. It returns how many
// one-time prekeys of each kind were handed out, and fails the test on
// any answer that is not a usable bundle.
func drain(t *testing.T, ss []*Service, attacker Caller, tries int) (pre, kem, limited int) {
	t.Helper()
	if got := call(t, ss[0], attacker, &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "v"}); got.Type == protocol.TypeError {
		t.Fatalf("open_direct: %s %s", got.Code, got.Error)
	}
	for i := range tries {
		got := call(t, ss[i%len(ss)], attacker, &protocol.Frame{Type: protocol.TypeKeysBundle, UserID: "v", DeviceID: "d"})
		if got.Type != protocol.TypeBundles || len(got.Bundles) != 1 {
			t.Fatalf("keys_bundle answered %s %s %s; want one bundle", got.Type, got.Code, got.Error)
		}
		if data, err := json.Marshal(got); err != nil {
			t.Fatal(err)
		} else if err := schema.ServerFrame(data); err != nil {
			t.Fatalf("bundles %s does not match protocol/schema/frames.json: %v", data, err)
		}
		b := got.Bundles[0]
		if len(b.SignedPreKey.Key) == 0 || b.KEMPreKey == nil {
			t.Fatalf("bundle without a signed prekey or a KEM key: %+v", b)
		}
		if b.PreKey != nil {
			pre++
		}
		if !b.KEMLastResort {
			kem++
		}
		if b.Limited {
			limited++
			if b.PreKey != nil || !b.KEMLastResort {
				t.Fatalf("a limited bundle carries a one-time prekey: %+v", b)
			}
		}
	}
	return pre, kem, limited
}

// TestPrekeyDrainBounded: a stranger who opened a direct conversation
// with the victim, fetching bundles in a loop, gets at most the per-device
// bound of one-time prekeys; every later answer is still a bundle a
// session can start from (signed prekey and last-resort KEM key), marked
// limited. A second attacker account gets nothing more from the same
// device, and the victim keeps the rest of its keys.
func TestPrekeyDrainBounded(t *testing.T) {
	r := newPrekeyRig(t)
	cfg := DefaultConfig()
	s := r.service(cfg, nil, 1)
	testPrekeyDrain(t, cfg, s, s)
}

// TestPrekeyDrainBoundedAcrossProcesses: two chat processes on one store
// sharing the cluster limiter on Redis; the attacker alternates between
// them and still gets only the device's bound.
func TestPrekeyDrainBoundedAcrossProcesses(t *testing.T) {
	addr := os.Getenv("PARLEY_TEST_REDIS")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires Redis: PARLEY_TEST_REDIS is unset (scripts/engines/up.sh start)")
		}
		t.Skip("PARLEY_TEST_REDIS is unset; run scripts/engines/up.sh start")
	}
	rc := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { rc.Close() })
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "parleytest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rc.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rc.Del(ctx, iter.Val())
		}
	})
	r := newPrekeyRig(t)
	cfg := DefaultConfig()
	s1 := r.service(cfg, limit.New(rc, prefix), 1)
	s2 := r.service(cfg, limit.New(rc, prefix), 2)
	testPrekeyDrain(t, cfg, s1, s2)
}

func testPrekeyDrain(t *testing.T, cfg Config, s1, s2 *Service) {
	publish(t, s1, Caller{User: "v", Device: "d"}, 100)
	const tries = 100
	pre, kem, limited := drain(t, []*Service{s1, s2}, Caller{User: "mallory", Device: "m"}, tries)
	t.Logf("attacker: %d of %d fetches got a one-time Curve25519 prekey, %d an ML-KEM one; %d answers limited", pre, tries, kem, limited)
	if bound := cfg.PrekeysPerDevice; pre != bound || kem != bound || limited != tries-bound {
		t.Fatalf("a stranger took %d Curve25519 and %d ML-KEM one-time prekeys in %d fetches (%d limited); want %d and %d limited",
			pre, kem, tries, limited, bound, tries-bound)
	}
	// A second account: the device's bound is spent, whoever asks.
	if pre, kem, _ := drain(t, []*Service{s2, s1}, Caller{User: "trudy", Device: "t"}, 10); pre != 0 || kem != 0 {
		t.Fatalf("a second stranger took %d and %d more one-time prekeys; want 0", pre, kem)
	}
	got := call(t, s1, Caller{User: "v", Device: "d"}, &protocol.Frame{Type: protocol.TypeKeysUpload, Keys: &protocol.KeyUpload{}})
	if want := 100 - cfg.PrekeysPerDevice; got.KeyCounts == nil || got.KeyCounts.PreKeys != want || got.KeyCounts.KEMPreKeys != want {
		t.Fatalf("victim holds %+v one-time prekeys; want %d of each", got.KeyCounts, want)
	}
}

// TestPrekeyRequesterBound: one user fetching many devices' bundles gets
// one-time prekeys for at most its own bound, however many devices.
func TestPrekeyRequesterBound(t *testing.T) {
	r := newPrekeyRig(t)
	cfg := DefaultConfig()
	cfg.PrekeysPerRequester = 5
	s := r.service(cfg, nil, 1)
	const victims = 8
	pre := 0
	for i := range victims {
		v := Caller{User: fmt.Sprint("v", i), Device: "d"}
		publish(t, s, v, 2)
		if got := call(t, s, Caller{User: "mallory", Device: "m"}, &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: v.User}); got.Type == protocol.TypeError {
			t.Fatalf("open_direct: %s %s", got.Code, got.Error)
		}
		got := call(t, s, Caller{User: "mallory", Device: "m"}, &protocol.Frame{Type: protocol.TypeKeysBundle, UserID: v.User})
		if got.Type != protocol.TypeBundles || len(got.Bundles) != 1 {
			t.Fatalf("keys_bundle answered %s %s %s; want one bundle", got.Type, got.Code, got.Error)
		}
		if b := got.Bundles[0]; b.PreKey != nil {
			pre++
		} else if !b.Limited || !b.KEMLastResort || b.KEMPreKey == nil {
			t.Fatalf("bundle without a one-time prekey is not a limited last-resort bundle: %+v", b)
		}
	}
	if pre != cfg.PrekeysPerRequester {
		t.Fatalf("one requester got one-time prekeys from %d of %d devices; want %d", pre, victims, cfg.PrekeysPerRequester)
	}
}
