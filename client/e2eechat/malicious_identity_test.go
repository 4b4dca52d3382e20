package e2eechat

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Malicious-server tests of the identity model: the server (the test,
// with the node's own store in hand) substitutes identity keys, adds
// devices and writes system events; real SDK clients on a real node must
// refuse what the account keys did not certify, or report it.

// evil is a node and the store its chat service writes: what a malicious
// operator holds.
type evil struct {
	srv *servertest.Server
	st  store.Store
}

// engines runs f on a node over Pebble and, when PARLEY_TEST_CASSANDRA is
// set, over Cassandra.
func engines(t *testing.T, f func(t *testing.T, e *evil)) {
	t.Run("pebble", func(t *testing.T) {
		e := &evil{}
		e.srv = servertest.Start(t, servertest.WithDeps(func(d *server.Deps) {
			d.WrapStore = func(s store.Store) store.Store { e.st = s; return s }
		}))
		f(t, e)
	})
	t.Run("cassandra", func(t *testing.T) {
		cs, _ := cassandraStore(t)
		e := &evil{st: cs}
		e.srv = servertest.Start(t, servertest.WithDeps(func(d *server.Deps) {
			d.WrapStore = func(store.Store) store.Store { return cs }
		}))
		f(t, e)
	})
}

// impostor is the operator's own device for addr: its own identity key
// and, with account, its own account key certifying it (it has no key of
// addr's user).
func impostor(t *testing.T, addr e2ee.Address, account bool) *e2ee.Device {
	t.Helper()
	d, err := e2ee.OpenDevice(e2ee.NewMemoryStore(), addr)
	if err != nil {
		t.Fatal(err)
	}
	if account {
		if _, err := d.CreateAccountKey(); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// plant writes d into the key directory as its address, bypassing every
// check of keys_upload: the operator's write to its own database.
func (e *evil) plant(t *testing.T, d *e2ee.Device) {
	t.Helper()
	up, err := d.GenerateKeys(3)
	if err != nil {
		t.Fatal(err)
	}
	su := store.KeyUpload{RegistrationID: up.RegistrationID, IdentityKey: up.IdentityKey.Bytes(),
		SignedPreKey:  &store.PreKey{ID: up.SignedPreKey.ID, Key: up.SignedPreKey.Key.Bytes(), Sig: up.SignedPreKey.Sig},
		LastResortKEM: &store.PreKey{ID: up.LastResortKEM.ID, Key: up.LastResortKEM.Key, Sig: up.LastResortKEM.Sig},
		Now:           time.Now().UnixMilli()}
	for _, p := range up.PreKeys {
		su.PreKeys = append(su.PreKeys, store.PreKey{ID: p.ID, Key: p.Key.Bytes()})
	}
	for _, p := range up.KEMPreKeys {
		su.KEMPreKeys = append(su.KEMPreKeys, store.PreKey{ID: p.ID, Key: p.Key, Sig: p.Sig})
	}
	if ak, sig, err := d.DeviceCertificate(); err == nil {
		su.AccountKey, su.DeviceSig = ak.Bytes(), sig
	}
	if _, err := e.st.UploadKeys(context.Background(), d.Address().User, d.Address().Device, su); err != nil {
		t.Fatal(err)
	}
}

// forge is a message of conv labelled as sent by from's address, with a
// first message from from's device to the recipient's device to.
func forge(t *testing.T, e *evil, from *e2ee.Device, to e2ee.Address, like protocol.Message, text string) protocol.Message {
	t.Helper()
	kb, err := e.st.TakeBundle(context.Background(), to.User, to.Device)
	if err != nil {
		t.Fatal(err)
	}
	pb := protocol.KeyBundle{UserID: to.User, DeviceID: to.Device, RegistrationID: kb.Device.RegistrationID,
		IdentityKey: kb.Device.IdentityKey, SignedPreKey: protocol.PreKey{ID: kb.Device.SignedPreKey.ID, Key: kb.Device.SignedPreKey.Key, Sig: kb.Device.SignedPreKey.Sig}}
	if kb.PreKey != nil {
		pb.PreKey = &protocol.PreKey{ID: kb.PreKey.ID, Key: kb.PreKey.Key}
	}
	pb.KEMPreKey = &protocol.PreKey{ID: kb.KEMPreKey.ID, Key: kb.KEMPreKey.Key, Sig: kb.KEMPreKey.Sig}
	b, err := bundleFrom(pb)
	if err != nil {
		t.Fatal(err)
	}
	if err := from.ProcessBundle(b); err != nil {
		t.Fatal(err)
	}
	// The impostor seals every label as the server shows them: the
	// metadata checks have nothing to object to.
	m := like
	m.Seq += 1000
	plain, _ := json.Marshal(content{T: "text", Text: text, Conv: m.ConvID, Kind: protocol.KindText,
		From: from.Address().User, Dev: from.Address().Device, Ctr: m.Seq})
	typ, ct, err := from.Encrypt(to, plain)
	if err != nil {
		t.Fatal(err)
	}
	m.Sender, m.SenderDevice = from.Address().User, from.Address().Device
	m.ClientMsgID = "forged"
	m.Body = protocol.EncodeEnvelope(protocol.Envelope{To: []protocol.EnvelopeTo{{User: to.User, Device: to.Device, Type: int(typ), Body: ct}}})
	return m
}

// events collects m's identity events.
func events(m *Messenger) func() []IdentityEvent {
	ch := make(chan IdentityEvent, 64)
	m.OnIdentity(func(ev IdentityEvent) { ch <- ev })
	return func() []IdentityEvent {
		var out []IdentityEvent
		for {
			select {
			case ev := <-ch:
				out = append(out, ev)
			default:
				return out
			}
		}
	}
}

// lastTo is the envelope of the newest message of conv and who it is
// encrypted to.
func lastTo(t *testing.T, d *dev, conv uint64) (protocol.Message, []string) {
	t.Helper()
	h := d.history(t, conv)
	m := h[len(h)-1]
	env, err := protocol.ParseEnvelope(m.Body)
	if err != nil {
		t.Fatal(err)
	}
	var to []string
	for _, x := range env.To {
		to = append(to, x.User+"/"+x.Device)
	}
	return m, to
}

// A first message from another identity, labelled by the server as
// alice's, does not replace alice's identity: bob refuses it, and bob's
// reply to alice stays unreadable for the operator's device.
func TestMaliciousServerSubstitutesIdentity(t *testing.T) {
	engines(t, func(t *testing.T, e *evil) {
		ctx := ctxT(t)
		alice := startDev(t, e.srv, "alice", "phone", 5)
		bob := startDev(t, e.srv, "bob", "phone", 5)
		conv, err := alice.c.OpenDirectE2E(ctx, "bob")
		if err != nil {
			t.Fatal(err)
		}
		a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "hi bob")
		if err != nil {
			t.Fatal(err)
		}
		wantText(t, "bob", bob.read(t, conv.ConvID), a1.Seq, "hi bob")
		aliceAddr := e2ee.Address{User: "alice", Device: "phone"}
		known, _, _ := bob.m.Device().PeerIdentity(aliceAddr)
		heard := events(bob.m)

		// The operator's device, labelled alice/phone, with no certificate
		// by alice's account key (a fresh account key of its own).
		mallory := impostor(t, aliceAddr, true)
		forged := forge(t, e, mallory, e2ee.Address{User: "bob", Device: "phone"}, firstMessage(t, bob, conv.ConvID, a1.Seq), "send the money to mallory")
		if o, err := bob.m.Open(forged); !errors.Is(err, ErrUncertified) {
			t.Fatalf("first message from another identity as alice's: %+v %v; want ErrUncertified", o, err)
		}
		if k, _, _ := bob.m.Device().PeerIdentity(aliceAddr); k != known {
			t.Fatal("alice's recorded identity was replaced")
		}
		if evs := heard(); len(evs) != 1 || evs[0].Kind != DeviceRefused || evs[0].User != "alice" {
			t.Fatalf("identity events %+v; want alice/phone refused", evs)
		}
		// bob's reply reaches alice, and not the impostor.
		b1, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "which money?")
		if err != nil {
			t.Fatal(err)
		}
		reply, _ := lastTo(t, bob, conv.ConvID)
		env, _ := protocol.ParseEnvelope(reply.Body)
		for _, x := range env.To {
			if x.User == "alice" {
				if _, err := mallory.Decrypt(e2ee.Address{User: "bob", Device: "phone"}, e2ee.MessageType(x.Type), x.Body); err == nil {
					t.Fatal("the impostor read bob's reply to alice")
				}
			}
		}
		wantText(t, "alice", alice.read(t, conv.ConvID), b1.Seq, "which money?")

		// The operator also rewrites alice's entry in the directory with
		// its device: still no certificate by alice's account key... but
		// its own account key for alice's only device is a change of
		// alice's account key, which bob reports with the new safety
		// number (trust on first use accepts it, as Signal does).
		e.plant(t, mallory)
		forged = forge(t, e, mallory, e2ee.Address{User: "bob", Device: "phone"}, firstMessage(t, bob, conv.ConvID, a1.Seq), "it is me, alice")
		forged.Seq++
		if _, err := bob.m.Open(forged); err != nil {
			t.Fatalf("first message from the account key now listed: %v", err)
		}
		evs := heard()
		if len(evs) != 1 || evs[0].Kind != AccountChanged || evs[0].User != "alice" || !evs[0].Accepted ||
			evs[0].SafetyNumber == "" || evs[0].SafetyNumber == evs[0].OldSafetyNumber {
			t.Fatalf("identity events %+v; want alice's account key changed, with a new safety number", evs)
		}
	})
}

// A device the server adds for bob gets nothing: alice encrypts only to
// the devices bob's account key certified, and reports the other.
func TestMaliciousServerGhostDevice(t *testing.T) {
	engines(t, func(t *testing.T, e *evil) {
		ctx := ctxT(t)
		alice := startDev(t, e.srv, "alice", "phone", 5)
		bob := startDev(t, e.srv, "bob", "phone", 5)
		conv, err := alice.c.OpenDirectE2E(ctx, "bob")
		if err != nil {
			t.Fatal(err)
		}
		a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "before the ghost")
		if err != nil {
			t.Fatal(err)
		}
		wantText(t, "bob", bob.read(t, conv.ConvID), a1.Seq, "before the ghost")
		heard := events(alice.m)
		// A ghost listed under bob's account key with a signature the
		// operator cannot make (a consistent directory, as a key
		// transparency log would show it).
		forged := impostor(t, e2ee.Address{User: "bob", Device: "ghost"}, false)
		e.plant(t, forged)
		bobAccount, _, _ := bob.m.Device().AccountKey()
		sig := make([]byte, 64)
		if _, err := e.st.UploadKeys(ctx, "bob", "ghost", store.KeyUpload{AccountKey: bobAccount.Bytes(), DeviceSig: sig, Now: 1}); err != nil {
			t.Fatal(err)
		}
		a2, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "after the ghost")
		if err != nil {
			t.Fatal(err)
		}
		if _, to := lastTo(t, alice, conv.ConvID); len(to) != 1 || to[0] != "bob/phone" {
			t.Fatalf("alice encrypted to %v; want bob/phone (and none of the server's devices)", to)
		}
		refused := map[string]bool{}
		for _, ev := range heard() {
			if ev.Kind == DeviceRefused {
				refused[ev.User+"/"+ev.Device] = true
			}
		}
		if !refused["bob/ghost"] {
			t.Fatalf("refused devices reported %v; want bob/ghost", refused)
		}
		wantText(t, "bob", bob.read(t, conv.ConvID), a2.Seq, "after the ghost")
		// bob's own device, sending to alice and to its own other devices,
		// refuses it too.
		if _, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "hello"); err != nil {
			t.Fatal(err)
		}
		if _, to := lastTo(t, bob, conv.ConvID); len(to) != 1 || to[0] != "alice/phone" {
			t.Fatalf("bob encrypted to %v; want alice/phone only", to)
		}
		// A second ghost certified by an account key of the operator's:
		// the send may fail (a directory under two account keys is
		// refused by key transparency) but never reaches a ghost.
		before, _ := lastTo(t, alice, conv.ConvID)
		e.plant(t, impostor(t, e2ee.Address{User: "bob", Device: "ghost2"}, true))
		_, err = alice.m.SendDirect(ctx, conv.ConvID, "bob", "after two ghosts")
		if after, to := lastTo(t, alice, conv.ConvID); err == nil && after.Seq != before.Seq {
			for _, x := range to {
				if x == "bob/ghost" || x == "bob/ghost2" {
					t.Fatalf("alice encrypted to the server's device %s (recipients %v)", x, to)
				}
			}
		} else if err == nil {
			t.Fatal("no error and nothing sent")
		}
	})
}

// System events the server writes about devices reset no session and
// change no trust: the next message goes on the session already there.
func TestMaliciousServerSystemEventsKeepSessions(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	bob := startDev(t, srv, "bob", "phone", 5)
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "hi")
	if err != nil {
		t.Fatal(err)
	}
	b1, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "hi back")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "bob", bob.read(t, conv.ConvID), a1.Seq, "hi")
	wantText(t, "alice", alice.read(t, conv.ConvID), b1.Seq, "hi back")
	if _, err := bob.m.Verify(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	aliceAddr := e2ee.Address{User: "alice", Device: "phone"}
	session, _, _ := bob.m.Device().SessionIdentity(aliceAddr)
	like := firstMessage(t, bob, conv.ConvID, a1.Seq)
	for i, ev := range []string{"device_removed", "identity_changed", "device_added"} {
		body, _ := json.Marshal(protocol.SystemEvent{Event: ev, Actor: "alice", Users: []string{"alice"}, Device: "phone"})
		m := protocol.Message{ConvID: conv.ConvID, Seq: like.Seq + 100 + uint64(i), Sender: "alice", Kind: protocol.KindSystem, Body: string(body)}
		if _, err := bob.m.Open(m); err != nil {
			t.Fatalf("%s: %v", ev, err)
		}
	}
	if k, ok, _ := bob.m.Device().SessionIdentity(aliceAddr); !ok || k != session {
		t.Fatal("a system event written by the server reset bob's session with alice")
	}
	if a, _, _ := bob.m.Device().PeerAccount("alice"); !a.Verified || a.Blocked {
		t.Fatalf("a system event changed bob's trust in alice: %+v", a)
	}
	b2, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "same session")
	if err != nil {
		t.Fatal(err)
	}
	reply, _ := lastTo(t, bob, conv.ConvID)
	env, _ := protocol.ParseEnvelope(reply.Body)
	if len(env.To) != 1 || env.To[0].Type != int(e2ee.TypeSignal) {
		t.Fatalf("bob's next message %+v; want a SignalMessage on the existing session", env.To)
	}
	wantText(t, "alice", alice.read(t, conv.ConvID), b2.Seq, "same session")
}

// substituteAccount replaces alice's only device in the directory with
// the operator's, certified by the operator's own account key: a
// consistent device list under a new account key, as a reinstall would
// look.
func substituteAccount(t *testing.T, e *evil) *e2ee.Device {
	t.Helper()
	mallory := impostor(t, e2ee.Address{User: "alice", Device: "phone"}, true)
	e.plant(t, mallory)
	return mallory
}

// Under TrustStrict a changed account key is refused with a typed error:
// nothing goes to the new key until the app accepts it.
func TestMaliciousServerStrictPolicyRefusesNewAccount(t *testing.T) {
	engines(t, func(t *testing.T, e *evil) {
		ctx := ctxT(t)
		alice := startDev(t, e.srv, "alice", "phone", 5)
		bob := startDev(t, e.srv, "bob", "phone", 5)
		bob.m.Device().SetTrustPolicy(e2ee.TrustStrict)
		conv, err := bob.c.OpenDirectE2E(ctx, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "first"); err != nil {
			t.Fatal(err)
		}
		heard := events(bob.m)
		before, _ := lastTo(t, bob, conv.ConvID)
		mallory := substituteAccount(t, e)
		_, err = bob.m.SendDirect(ctx, conv.ConvID, "alice", "secret")
		var ue *e2ee.UntrustedAccountError
		if !errors.As(err, &ue) || !errors.Is(err, e2ee.ErrUntrusted) || ue.User != "alice" {
			t.Fatalf("send after alice's account key changed under TrustStrict: %v; want *e2ee.UntrustedAccountError", err)
		}
		if after, _ := lastTo(t, bob, conv.ConvID); after.Seq != before.Seq {
			t.Fatal("something was sent")
		}
		evs := heard()
		if len(evs) != 1 || evs[0].Kind != AccountChanged || evs[0].Accepted {
			t.Fatalf("identity events %+v; want alice's change, not accepted", evs)
		}
		// Accepting it is the app's decision (after comparing numbers).
		if err := bob.m.AcceptIdentity("alice"); err != nil {
			t.Fatal(err)
		}
		if _, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "to the new key"); err != nil {
			t.Fatal(err)
		}
		if _, to := lastTo(t, bob, conv.ConvID); len(to) != 1 || to[0] != "alice/phone" {
			t.Fatalf("recipients %v", to)
		}
		_ = mallory
		_ = alice
	})
}

// A verified peer whose account key changes: sending is blocked, whatever
// the policy, until verified again.
func TestMaliciousServerVerifiedPeerBlocksSending(t *testing.T) {
	engines(t, func(t *testing.T, e *evil) {
		ctx := ctxT(t)
		startDev(t, e.srv, "alice", "phone", 5)
		bob := startDev(t, e.srv, "bob", "phone", 5)
		conv, err := bob.c.OpenDirectE2E(ctx, "alice")
		if err != nil {
			t.Fatal(err)
		}
		n, err := bob.m.Verify(ctx, "alice")
		if err != nil || len(n) != 60 {
			t.Fatalf("verify: %q %v", n, err)
		}
		if _, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "verified"); err != nil {
			t.Fatal(err)
		}
		heard := events(bob.m)
		before, _ := lastTo(t, bob, conv.ConvID)
		substituteAccount(t, e)
		if _, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "secret"); !errors.Is(err, e2ee.ErrVerifiedChanged) {
			t.Fatalf("send to a changed verified peer: %v; want e2ee.ErrVerifiedChanged", err)
		}
		if after, _ := lastTo(t, bob, conv.ConvID); after.Seq != before.Seq {
			t.Fatal("something was sent")
		}
		evs := heard()
		if len(evs) != 1 || evs[0].Kind != AccountChanged || !evs[0].WasVerified || evs[0].SafetyNumber == n {
			t.Fatalf("identity events %+v; want alice's change of a verified key", evs)
		}
		// Still blocked on the next try (the device list is cached now).
		if _, err := bob.m.Send(ctx, conv.ConvID, "again"); !errors.Is(err, e2ee.ErrVerifiedChanged) {
			t.Fatalf("second send: %v", err)
		}
		if n2, err := bob.m.Verify(ctx, "alice"); err != nil || n2 != evs[0].SafetyNumber {
			t.Fatalf("verify again: %q %v; want the new number %q", n2, err, evs[0].SafetyNumber)
		}
		if _, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "verified again"); err != nil {
			t.Fatal(err)
		}
	})
}

// In a group the sender key goes only to certified devices, and a
// verified member's changed account key blocks sending to the group.
func TestMaliciousServerGroupIdentity(t *testing.T) {
	engines(t, func(t *testing.T, e *evil) {
		ctx := ctxT(t)
		alice := startDev(t, e.srv, "alice", "phone", 5)
		bob := startDev(t, e.srv, "bob", "phone", 5)
		startDev(t, e.srv, "carol", "phone", 5)
		g, err := alice.c.CreateGroupE2E(ctx, "g", []string{"bob", "carol"})
		if err != nil {
			t.Fatal(err)
		}
		members := []string{"alice", "bob", "carol"}
		// A ghost for bob before the first group message: the sender key
		// distributions skip it.
		e.plant(t, impostor(t, e2ee.Address{User: "bob", Device: "ghost"}, false))
		bobAccount, _, _ := bob.m.Device().AccountKey()
		if _, err := e.st.UploadKeys(ctx, "bob", "ghost", store.KeyUpload{AccountKey: bobAccount.Bytes(), DeviceSig: make([]byte, 64), Now: 1}); err != nil {
			t.Fatal(err)
		}
		g1, err := alice.m.SendGroup(ctx, g.ConvID, members, "to the group")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range alice.history(t, g.ConvID) {
			env, err := protocol.ParseEnvelope(m.Body)
			if err != nil {
				continue
			}
			for _, x := range env.To {
				if x.Device == "ghost" {
					t.Fatalf("a sender key distribution for the ghost device: %+v", env.To)
				}
			}
		}
		wantText(t, "bob", bob.read(t, g.ConvID), g1.Seq, "to the group")
		// carol, verified by alice, is substituted by the operator.
		if _, err := alice.m.Verify(ctx, "carol"); err != nil {
			t.Fatal(err)
		}
		e.plant(t, impostor(t, e2ee.Address{User: "carol", Device: "phone"}, true))
		alice.m.forget("carol") // as a device_removed or identity_changed event does
		if _, err := alice.m.SendGroup(ctx, g.ConvID, members, "secret"); !errors.Is(err, e2ee.ErrVerifiedChanged) {
			t.Fatalf("group send with a changed verified member: %v; want e2ee.ErrVerifiedChanged", err)
		}
	})
}
