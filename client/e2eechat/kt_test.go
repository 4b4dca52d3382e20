package e2eechat

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/kt"
)

// Key transparency against a malicious server: real SDK clients and a real
// node, the server's log played by evilServer (ktserver_test.go).

// A server that lies in a bundles or devices answer — about a key, a
// proof, a label, the checkpoint's signer, or by giving an older entry —
// is refused once the log's keys are pinned.
func TestMaliciousServerKTAnswersRefused(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	keys := newEvilKeys(t)
	log := newEvilLog(keys)
	ev := startEvilServer(t, srv.URL, log)
	startDev(t, srv, "bob", "phone", 5)
	alice := devOn(t, ev.URL, srv, "alice", "phone", e2ee.NewMemoryStore())
	if _, err := alice.m.PublishKeys(ctx, 5); err != nil {
		t.Fatal(err)
	}
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	events := watchKT(alice.m)
	if _, err := alice.m.Devices(ctx, "bob", true); err != nil {
		t.Fatalf("an honest answer: %v", err)
	}
	head, ok := alice.m.KTCheckpoint()
	if !ok || head.Size != log.size() || head.Origin != keys.pub.Origin {
		t.Fatalf("head %+v %v, want size %d of %s", head, ok, log.size(), keys.pub.Origin)
	}
	// bob's second device: his entry's version 2, so version 1 is older.
	startDev(t, srv, "bob", "laptop", 5)
	if _, err := alice.m.Devices(ctx, "bob", true); err != nil {
		t.Fatal(err)
	}
	log.mu.Lock()
	old := log.leaves[0] // bob's version 1
	log.mu.Unlock()
	if e, _ := kt.UnmarshalEntry(old); e.Version != 1 {
		t.Fatalf("leaf 0 is version %d", e.Version)
	}
	_, otherVRF := kt.LabelFor(keys.vrf, "carol")
	otherSigned := func() string {
		k := newEvilKeys(t)
		l := newEvilLog(k)
		return l.proofFor("bob").Checkpoint
	}()

	cases := []struct {
		name   string
		tamper func(ans *protocol.Frame)
	}{
		{"no proof", func(ans *protocol.Frame) { ans.KT = nil }},
		{"identity key not the logged one", func(ans *protocol.Frame) {
			k := e2ee.GenerateKeyPair().Public
			ans.Devices[0].IdentityKey = k.Bytes()
		}},
		{"a device not in the entry", func(ans *protocol.Frame) {
			g := ans.Devices[0]
			g.DeviceID = "ghost"
			ans.Devices = append(ans.Devices, g)
		}},
		{"inclusion proof altered", func(ans *protocol.Frame) { ans.KT.Proof[0][3] ^= 1 }},
		{"entry altered", func(ans *protocol.Frame) { ans.KT.Entry[len(ans.KT.Entry)-1] ^= 1 }},
		{"another user's VRF proof", func(ans *protocol.Frame) { ans.KT.VRFProof = otherVRF }},
		{"label not the VRF output", func(ans *protocol.Frame) { ans.KT.Label[0] ^= 1 }},
		{"checkpoint of another key", func(ans *protocol.Frame) { ans.KT.Checkpoint = otherSigned }},
		{"devices without an entry", func(ans *protocol.Frame) { ans.KT.Entry, ans.KT.Proof, ans.KT.Index = nil, nil, 0 }},
		{"an older entry of the user", func(ans *protocol.Frame) {
			ans.KT.Entry, ans.KT.Index = old, 0
			ans.KT.Proof, _ = log.tree.InclusionProof(0, log.size())
			ans.Devices = ans.Devices[:1] // the phone, in version 1 too
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ev.setTamper(func(req protocol.Frame, ans *protocol.Frame) {
				if req.UserID == "bob" {
					c.tamper(ans)
				}
			})
			defer ev.setTamper(nil)
			before := len(events.list())
			if _, err := alice.m.Devices(ctx, "bob", true); !errors.Is(err, ErrKTProof) {
				t.Fatalf("Devices: %v, want ErrKTProof", err)
			}
			evs := events.list()
			if len(evs) != before+1 || evs[before].User != "bob" || !errors.Is(evs[before].Err, ErrKTProof) {
				t.Fatalf("events %+v, want one ErrKTProof for bob", evs[before:])
			}
		})
	}
	// The same lies in a bundles answer stop the session before it starts.
	ev.setTamper(func(req protocol.Frame, ans *protocol.Frame) {
		if req.Type == protocol.TypeKeysBundle {
			k := e2ee.GenerateKeyPair().Public
			ans.Bundles[0].IdentityKey = k.Bytes()
		}
	})
	if _, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "hello"); !errors.Is(err, ErrKTProof) {
		t.Fatalf("SendDirect with a substituted bundle: %v, want ErrKTProof", err)
	}
}

// The server is restarted on an old copy of its log (leaves lost), then
// appends again: a device that saw the lost leaves refuses the shorter log
// and the diverged one.
func TestMaliciousServerKTRollback(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	log := newEvilLog(newEvilKeys(t))
	ev := startEvilServer(t, srv.URL, log)
	startDev(t, srv, "bob", "phone", 5)
	alice := devOn(t, ev.URL, srv, "alice", "phone", e2ee.NewMemoryStore())
	if _, err := alice.m.PublishKeys(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.c.OpenDirectE2E(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	events := watchKT(alice.m)
	if _, err := alice.m.Devices(ctx, "alice", true); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.m.Devices(ctx, "bob", true); err != nil {
		t.Fatal(err)
	}
	saved := log.size() // the copy the server will be restarted on
	startDev(t, srv, "bob", "laptop", 5)
	if _, err := alice.m.Devices(ctx, "bob", true); err != nil {
		t.Fatal(err)
	}
	head, _ := alice.m.KTCheckpoint()
	if head.Size != saved+1 {
		t.Fatalf("head of %d leaves, want %d", head.Size, saved+1)
	}

	log.mu.Lock()
	restored := log.prefix(int(saved))
	log.mu.Unlock()
	ev.show(restored, nil)
	// Shorter: alice's own entry is proven in a log of `saved` leaves,
	// which cannot be shown to be a prefix of the one alice saw.
	if _, err := alice.m.Devices(ctx, "alice", true); !errors.Is(err, ErrKTFork) || !errors.Is(err, kt.ErrRollback) {
		t.Fatalf("rolled-back log: %v, want ErrKTFork (rollback)", err)
	}
	// Diverged: the restarted server logs bob's laptop again, as a new
	// leaf where the lost one was.
	if _, err := alice.m.Devices(ctx, "bob", true); !errors.Is(err, ErrKTFork) {
		t.Fatalf("diverged log: %v, want ErrKTFork", err)
	}
	if restored.size() != saved+1 {
		t.Fatalf("the restored log has %d leaves, want %d", restored.size(), saved+1)
	}
	if now, _ := alice.m.KTCheckpoint(); now != head {
		t.Fatalf("the head moved to %+v", now)
	}
	evs := events.list()
	if len(evs) != 2 || !errors.Is(evs[0].Err, ErrKTFork) || !errors.Is(evs[1].Err, ErrKTFork) {
		t.Fatalf("events %+v, want two ErrKTFork", evs)
	}
	// A client restarted on the same store still holds the pinned keys and
	// the head.
	again := devOn(t, ev.URL, srv, "alice", "phone", alice.st)
	if _, err := again.m.Devices(ctx, "bob", true); !errors.Is(err, ErrKTFork) {
		t.Fatalf("after a restart of the client: %v, want ErrKTFork", err)
	}
	if h, ok := again.m.KTCheckpoint(); !ok || h != head {
		t.Fatalf("restarted client's head %+v %v", h, ok)
	}
}

// A split view: the server shows alice a log in which bob has a ghost
// device (the server's, certified by an account key the server made) and
// shows bob a log without it. Alice's message reaches the ghost — the
// server reads it — but the checkpoint sealed inside it is not consistent
// with bob's log, so bob's client refuses it, and bob's reply, carrying
// bob's checkpoint, is refused by alice's.
func TestMaliciousServerKTSplitView(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	keys := newEvilKeys(t)
	logA, logB := newEvilLog(keys), newEvilLog(keys)
	evA := startEvilServer(t, srv.URL, logA)
	evB := startEvilServer(t, srv.URL, logB)
	alice := devOn(t, evA.URL, srv, "alice", "phone", e2ee.NewMemoryStore())
	bob := devOn(t, evB.URL, srv, "bob", "phone", e2ee.NewMemoryStore())
	for _, d := range []*dev{alice, bob} {
		if _, err := d.m.PublishKeys(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	alertsA, alertsB := watchKT(alice.m), watchKT(bob.m)

	ghost, ghostB := ghostBundle(t, "bob", "ghost")
	evil := newEvilAccount()
	evA.show(logA, evil.impersonate("bob", ghostB))
	evA.setAnswer(serveGhost("bob", ghostB))

	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	// bob's client knows the log bob is shown: his and alice's entries.
	for _, u := range []string{"bob", "alice"} {
		if _, err := bob.m.Devices(ctx, u, true); err != nil {
			t.Fatal(err)
		}
	}
	a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "meet at 10, gate A")
	if err != nil {
		t.Fatalf("alice's send through the forged log: %v", err)
	}
	msgA := firstMessage(t, bob, conv.ConvID, a1.Seq)
	if got := ghostReads(t, ghost, msgA); got != "meet at 10, gate A" {
		t.Fatalf("the ghost read %q: the attack did not happen", got)
	}
	headA, _ := alice.m.KTCheckpoint()
	headB, _ := bob.m.KTCheckpoint()
	if headA.Size != headB.Size || headA.Root == headB.Root {
		t.Fatalf("heads %d and %d: not two logs of one size", headA.Size, headB.Size)
	}

	if o, err := bob.m.Open(msgA); !errors.Is(err, ErrKTFork) {
		t.Fatalf("bob opened alice's message from the other view: %+v %v, want ErrKTFork", o, err)
	}
	if evs := alertsB.list(); len(evs) != 1 || evs[0].User != "alice" || !errors.Is(evs[0].Err, ErrKTFork) {
		t.Fatalf("bob's events %+v, want one ErrKTFork for alice's message", evs)
	}

	b1, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "which gate?")
	if err != nil {
		t.Fatal(err)
	}
	if o, err := alice.m.Open(firstMessage(t, alice, conv.ConvID, b1.Seq)); !errors.Is(err, ErrKTFork) {
		t.Fatalf("alice opened bob's message from the other view: %+v %v, want ErrKTFork", o, err)
	}
	if evs := alertsA.list(); len(evs) != 1 || evs[0].User != "bob" || !errors.Is(evs[0].Err, ErrKTFork) {
		t.Fatalf("alice's events %+v, want one ErrKTFork for bob's message", evs)
	}
}

// One log, shown to both: the checkpoints sealed inside messages are
// proven consistent and every message opens.
func TestKTGossipOneLog(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	log := newEvilLog(newEvilKeys(t))
	evA := startEvilServer(t, srv.URL, log)
	evB := startEvilServer(t, srv.URL, log)
	alice := devOn(t, evA.URL, srv, "alice", "phone", e2ee.NewMemoryStore())
	bob := devOn(t, evB.URL, srv, "bob", "phone", e2ee.NewMemoryStore())
	for _, d := range []*dev{alice, bob} {
		if _, err := d.m.PublishKeys(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "one")
	if err != nil {
		t.Fatal(err)
	}
	// bob has no checkpoint yet: alice's is newer, bob catches up.
	if o, err := bob.m.Open(firstMessage(t, bob, conv.ConvID, a1.Seq)); err != nil || o.Text != "one" {
		t.Fatalf("bob: %+v %v", o, err)
	}
	// bob's laptop grows the log; bob's reply carries the newer head.
	startDev(t, srv, "bob", "laptop", 5)
	b1, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", "two")
	if err != nil {
		t.Fatal(err)
	}
	if o, err := alice.m.Open(firstMessage(t, alice, conv.ConvID, b1.Seq)); err != nil || o.Text != "two" {
		t.Fatalf("alice: %+v %v", o, err)
	}
	ha, _ := alice.m.KTCheckpoint()
	hb, _ := bob.m.KTCheckpoint()
	if ha != hb {
		t.Fatalf("after gossip alice holds %+v, bob %+v", ha, hb)
	}
	// alice's older message again: her old head is a prefix of bob's now.
	a2, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "three")
	if err != nil {
		t.Fatal(err)
	}
	if o, err := bob.m.Open(firstMessage(t, bob, conv.ConvID, a2.Seq)); err != nil || o.Text != "three" {
		t.Fatalf("bob: %+v %v", o, err)
	}
}

// The server adds a device for bob — its own, under an account key it
// made, shown to alice, who never saw bob before and so takes it — and
// logs it, as it must for alice's client to accept it. Alice's message
// reaches the ghost and nothing on alice's side can tell; bob's own client,
// monitoring the log, finds the entry it did not publish.
func TestMaliciousServerKTGhostDevice(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	log := newEvilLog(newEvilKeys(t))
	evA := startEvilServer(t, srv.URL, log)
	evB := startEvilServer(t, srv.URL, log)
	alice := devOn(t, evA.URL, srv, "alice", "phone", e2ee.NewMemoryStore())
	bob := devOn(t, evB.URL, srv, "bob", "phone", e2ee.NewMemoryStore())
	for _, d := range []*dev{alice, bob} {
		if _, err := d.m.PublishKeys(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	alertsA, alertsB := watchKT(alice.m), watchKT(bob.m)
	if err := bob.m.MonitorKeys(ctx); err != nil {
		t.Fatalf("bob's first monitoring, nothing forged yet: %v", err)
	}

	ghost, ghostB := ghostBundle(t, "bob", "ghost")
	evA.show(log, newEvilAccount().impersonate("bob", ghostB))
	evA.setAnswer(serveGhost("bob", ghostB))
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "the door code is 4711")
	if err != nil {
		t.Fatalf("alice's send: %v", err)
	}
	msg := firstMessage(t, bob, conv.ConvID, a1.Seq)
	if got := ghostReads(t, ghost, msg); got != "the door code is 4711" {
		t.Fatalf("the ghost read %q: the attack did not happen", got)
	}
	if evs := alertsA.list(); len(evs) != 0 {
		t.Fatalf("alice's events %+v: one log, nothing for her to see", evs)
	}
	// One log: bob reads alice's message, the gossiped heads agree.
	if o, err := bob.m.Open(msg); err != nil || o.Text != "the door code is 4711" {
		t.Fatalf("bob: %+v %v", o, err)
	}

	err = bob.m.MonitorKeys(ctx)
	if !errors.Is(err, ErrKTGhost) || !strings.Contains(err.Error(), `"ghost"`) || !strings.Contains(err.Error(), "account key that is not yours") {
		t.Fatalf("bob's monitoring: %v, want ErrKTGhost naming the ghost and the account key", err)
	}
	if evs := alertsB.list(); len(evs) != 1 || evs[0].User != "bob" || !errors.Is(evs[0].Err, ErrKTGhost) {
		t.Fatalf("bob's events %+v, want one ErrKTGhost", evs)
	}
	// Reported once; the next pass reads only what came after.
	if err := bob.m.MonitorKeys(ctx); err != nil {
		t.Fatalf("bob's next monitoring: %v", err)
	}
}

// Monitoring the real node's log, on both store engines: bob's own
// devices, as he publishes them, are found and nothing is reported.
func TestKTMonitorRealNode(t *testing.T) {
	t.Run("pebble", func(t *testing.T) { testKTMonitorRealNode(t, servertest.Start(t)) })
	t.Run("cassandra", func(t *testing.T) { testKTMonitorRealNode(t, cassandraServer(t)) })
}

func testKTMonitorRealNode(t *testing.T, srv *servertest.Server) {
	ctx := ctxT(t)
	bob := startDev(t, srv, "bob", "phone", 5)
	events := watchKT(bob.m)
	if err := bob.m.MonitorKeys(ctx); err != nil {
		t.Fatal(err)
	}
	// bob's laptop, under bob's account key, and other users' changes.
	startDev(t, srv, "bob", "laptop", 5)
	for i := range 30 {
		startDev(t, srv, fmt.Sprintf("u%02d", i), "phone", 1)
	}
	if err := bob.m.MonitorKeys(ctx); err != nil {
		t.Fatalf("after bob's laptop and 30 other users: %v", err)
	}
	if evs := events.list(); len(evs) != 0 {
		t.Fatalf("events %+v", evs)
	}
}

// The server hides the ghost's entry from bob's monitoring: it serves
// bob's pages without that leaf, or with an older entry of bob's in its
// place, but the pages must rebuild the checkpoint's root.
func TestMaliciousServerKTMonitorHiddenEntry(t *testing.T) {
	for _, hide := range []struct {
		name string
		page func(entries [][]byte, ghost int, old []byte) [][]byte
	}{
		{"leaf left out", func(entries [][]byte, ghost int, _ []byte) [][]byte {
			return append(entries[:ghost:ghost], entries[ghost+1:]...)
		}},
		{"an older entry in its place", func(entries [][]byte, ghost int, old []byte) [][]byte {
			out := slices.Clone(entries)
			out[ghost] = old
			return out
		}},
	} {
		t.Run(hide.name, func(t *testing.T) {
			srv := servertest.Start(t)
			ctx := ctxT(t)
			log := newEvilLog(newEvilKeys(t))
			evA := startEvilServer(t, srv.URL, log)
			evB := startEvilServer(t, srv.URL, log)
			alice := devOn(t, evA.URL, srv, "alice", "phone", e2ee.NewMemoryStore())
			bob := devOn(t, evB.URL, srv, "bob", "phone", e2ee.NewMemoryStore())
			for _, d := range []*dev{alice, bob} {
				if _, err := d.m.PublishKeys(ctx, 5); err != nil {
					t.Fatal(err)
				}
			}
			if err := bob.m.MonitorKeys(ctx); err != nil {
				t.Fatal(err)
			}
			log.mu.Lock()
			bobsOwn := log.leaves[log.latest["bob"]]
			log.mu.Unlock()
			_, ghostB := ghostBundle(t, "bob", "ghost")
			evA.show(log, newEvilAccount().impersonate("bob", ghostB))
			evA.setAnswer(serveGhost("bob", ghostB))
			if _, err := alice.c.OpenDirectE2E(ctx, "bob"); err != nil {
				t.Fatal(err)
			}
			if _, err := alice.m.Devices(ctx, "bob", true); err != nil {
				t.Fatal(err)
			}
			ghost := int(log.size()) - 1 // the entry with the ghost
			evB.setPages(func(ans *protocol.Frame) {
				from := int(ans.KT.From)
				if ghost >= from && ghost < from+len(ans.KT.Entries) {
					ans.KT.Entries = hide.page(ans.KT.Entries, ghost-from, bobsOwn)
				}
			})
			events := watchKT(bob.m)
			if err := bob.m.MonitorKeys(ctx); !errors.Is(err, ErrKTFork) && !errors.Is(err, ErrKTProof) {
				t.Fatalf("bob's monitoring of doctored pages: %v, want ErrKTFork or ErrKTProof", err)
			}
			if evs := events.list(); len(evs) != 1 {
				t.Fatalf("events %+v, want one", evs)
			}
		})
	}
}

// A user who starts over under a new account key (a reinstall without the
// old key, ReplaceAccount) finds the old account's entries under its label:
// they were published by the devices it replaced, before its account
// existed, and are not the server's doing. A ghost after it still is.
func TestKTMonitorAfterReplacedAccount(t *testing.T) {
	ctx := ctxT(t)
	srv := servertest.Start(t)
	old := startDev(t, srv, "bob", "phone", 5)
	if err := old.m.MonitorKeys(ctx); err != nil {
		t.Fatal(err)
	}
	startDev(t, srv, "bob", "laptop", 5)
	accounts.Delete(t.Name() + "/bob")
	bob := startDev(t, srv, "bob", "tablet", 0)
	if err := bob.m.ReplaceAccount(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.m.PublishKeys(ctx, 5); err != nil {
		t.Fatal(err)
	}
	events := watchKT(bob.m)
	if err := bob.m.MonitorKeys(ctx); err != nil {
		t.Fatalf("the new account's first monitoring: %v", err)
	}
	startDev(t, srv, "bob", "watch", 5) // under the new account key
	if err := bob.m.MonitorKeys(ctx); err != nil {
		t.Fatalf("after a device of the new account: %v", err)
	}
	if evs := events.list(); len(evs) != 0 {
		t.Fatalf("events %+v", evs)
	}
	// The old account's device uploads again under its key: the server
	// takes it only with replace_account, which an attacker holding the
	// old key could do; the new account must see it.
	if err := old.m.ReplaceAccount(ctx); err != nil {
		t.Fatal(err)
	}
	if err := bob.m.MonitorKeys(ctx); !errors.Is(err, ErrKTGhost) {
		t.Fatalf("an entry under another account key after ours: %v, want ErrKTGhost", err)
	}
}
