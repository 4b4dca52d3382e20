package e2eechat

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// The tests in this file play a malicious server between real SDK clients
// on a real node: the node relays what the clients send, the test does what
// a server could do besides (re-deliver a ciphertext under a new seq, hand
// out a bundle with a key stripped).

// firstMessage finds alice's message seq in conv as bob's history shows it.
func firstMessage(t *testing.T, bob *dev, conv, seq uint64) protocol.Message {
	t.Helper()
	for _, m := range bob.history(t, conv) {
		if m.Seq == seq {
			return m
		}
	}
	t.Fatalf("seq %d not in bob's history", seq)
	return protocol.Message{}
}

// A device whose one-time keys ran out is reached on its signed prekey and
// last-resort KEM key, which are never deleted: the captured first message
// must not open again once bob's session is gone.
func TestMaliciousServerReplaysFirstMessage(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	bob := startDev(t, srv, "bob", "phone", 0)
	if _, err := bob.m.PublishKeys(ctx, 0); err != nil { // no one-time keys at all
		t.Fatal(err)
	}
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "pay carol 100")
	if err != nil {
		t.Fatal(err)
	}
	first := firstMessage(t, bob, conv.ConvID, a1.Seq)
	if o, err := bob.m.Open(first); err != nil || o.Text != "pay carol 100" {
		t.Fatalf("first message: %+v %v", o, err)
	}
	if err := bob.m.Device().Reset(e2ee.Address{User: "alice", Device: "phone"}); err != nil {
		t.Fatal(err)
	}
	replay := first
	replay.Seq += 1000 // a new message as far as bob's kept copies go
	// The same bytes: their content was opened under another seq.
	if o, err := bob.m.Open(replay); !errors.Is(err, ErrMetadataMismatch) {
		t.Fatalf("replayed first message: %+v %v, want ErrMetadataMismatch", o, err)
	}
	// Other bytes for the same first message (an unknown protobuf field
	// appended, which parsers skip): the base key was used.
	env, err := protocol.ParseEnvelope(first.Body)
	if err != nil || len(env.To) != 1 {
		t.Fatalf("envelope %+v %v", env, err)
	}
	env.To[0].Body = append(env.To[0].Body, 15<<3, 1)
	replay.Body, replay.Seq = protocol.EncodeEnvelope(*env), replay.Seq+1
	if o, err := bob.m.Open(replay); !errors.Is(err, e2ee.ErrReusedBaseKey) {
		t.Fatalf("re-encoded first message: %+v %v, want ErrReusedBaseKey", o, err)
	}
}

// The server strips the KEM prekey from bob's bundle for a sender that
// would accept classic X3DH, and delivers the version 3 result as alice's.
func TestMaliciousServerDowngradedFirstMessage(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	bob := startDev(t, srv, "bob", "phone", 5)
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "genuine")
	if err != nil {
		t.Fatal(err)
	}
	bs, err := alice.c.FetchBundles(ctx, "bob", "phone")
	if err != nil || len(bs) != 1 {
		t.Fatalf("bundles %v %v", bs, err)
	}
	b, err := bundleFrom(bs[0])
	if err != nil {
		t.Fatal(err)
	}
	b.KEMPreKey = nil
	// alice's own device refuses the stripped bundle.
	if err := alice.m.Device().ProcessBundle(b); !errors.Is(err, e2ee.ErrDowngrade) {
		t.Fatalf("alice's device took a bundle without a KEM prekey: %v", err)
	}
	// alice's device, had it allowed X3DH, builds the downgraded first
	// message (with alice's certified identity key: another identity
	// would be ErrUncertified before the version is looked at).
	forger, err := e2ee.OpenDevice(alice.st.Snapshot(), e2ee.Address{User: "alice", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	forger.SetAllowX3DH(true)
	if err := forger.ProcessBundle(b); err != nil {
		t.Fatal(err)
	}
	plain, _ := json.Marshal(content{T: "text", Text: "downgraded"})
	typ, ct, err := forger.Encrypt(b.Address, plain)
	if err != nil {
		t.Fatal(err)
	}
	forged := firstMessage(t, bob, conv.ConvID, a1.Seq)
	forged.Seq += 1000
	forged.Body = protocol.EncodeEnvelope(protocol.Envelope{To: []protocol.EnvelopeTo{{User: "bob", Device: "phone", Type: int(typ), Body: ct}}})
	if o, err := bob.m.Open(forged); !errors.Is(err, e2ee.ErrDowngrade) {
		t.Fatalf("version 3 first message: %+v %v, want ErrDowngrade", o, err)
	}
}
