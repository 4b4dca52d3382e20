package e2eechat

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// Malicious-server tests of the metadata bound inside the encryption: the
// node relays what real SDK clients send, and the test relabels what it
// delivers the way a server could (another conversation, sender, kind,
// target or seq), or forges what only an author may send.

// refused fails unless err is a *MetadataError about field (any field
// when field is empty) and the message showed no text.
func refused(t *testing.T, what string, o Opened, err error, field string) {
	t.Helper()
	var me *MetadataError
	switch {
	case err == nil:
		t.Fatalf("%s: accepted: %+v", what, o)
	case !errors.Is(err, ErrMetadataMismatch) || !errors.As(err, &me):
		t.Fatalf("%s: %v, want ErrMetadataMismatch", what, err)
	case field != "" && me.Field != field:
		t.Fatalf("%s: mismatch of %q (%v), want %q", what, me.Field, err, field)
	case o.Text != "":
		t.Fatalf("%s: refused but shows %q", what, o.Text)
	}
}

// openUpTo opens d's messages of conv up to seq: what came after is
// withheld by the server.
func openUpTo(t *testing.T, d *dev, conv, seq uint64) {
	t.Helper()
	for _, m := range d.history(t, conv) {
		if m.Seq <= seq {
			d.m.Open(m)
		}
	}
}

// msgAt is conv's message seq as d's history shows it.
func msgAt(t *testing.T, d *dev, conv, seq uint64) protocol.Message {
	t.Helper()
	return firstMessage(t, d, conv, seq)
}

// groupOf starts alice, bob and carol (one device each) in an E2E group.
func groupOf(t *testing.T, srv *servertest.Server) (alice, bob, carol *dev, conv uint64) {
	t.Helper()
	alice = startDev(t, srv, "alice", "phone", 5)
	bob = startDev(t, srv, "bob", "phone", 5)
	carol = startDev(t, srv, "carol", "phone", 5)
	g, err := alice.c.CreateGroupE2E(ctxT(t), "trip", []string{"bob", "carol"})
	if err != nil {
		t.Fatal(err)
	}
	return alice, bob, carol, g.ConvID
}

var trio = []string{"alice", "bob", "carol"}

// The server turns carol's message into an edit of alice's: a text
// relabelled as an edit, and an edit carol sealed herself (the server let
// it through) of a message she did not write.
func TestMaliciousServerEditsAnotherUsersMessage(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice, bob, carol, conv := groupOf(t, srv)
	a5, err := alice.m.SendGroup(ctx, conv, trio, "meet at 10, gate A")
	if err != nil {
		t.Fatal(err)
	}
	c1, err := carol.m.SendGroup(ctx, conv, trio, "meet at 11, gate F")
	if err != nil {
		t.Fatal(err)
	}
	openUpTo(t, bob, conv, c1.Seq-1) // alice's message, carol's sender key

	// carol's text, withheld from bob, delivered as an edit of alice's
	// message at the seq the text had.
	relabel := msgAt(t, bob, conv, c1.Seq)
	relabel.Kind, relabel.TargetSeq = protocol.KindEdit, a5.Seq
	o, err := bob.m.Open(relabel)
	refused(t, "carol's text relabelled as an edit of alice's", o, err, "kind")
	wantText(t, "bob after the relabelled edit", bob.read(t, conv), a5.Seq, "meet at 10, gate A")

	// carol seals an edit of alice's message; the server stores it.
	forged, _, err := carol.m.groupEnvelope(ctx, conv, trio, protocol.KindEdit, a5.Seq, content{T: "text", Text: "meet at 11, gate F"})
	if err != nil {
		t.Fatal(err)
	}
	edit := msgAt(t, bob, conv, c1.Seq)
	edit.Seq, edit.Kind, edit.TargetSeq, edit.Body = edit.Seq+1000, protocol.KindEdit, a5.Seq, forged
	o, err = bob.m.Open(edit)
	refused(t, "carol's edit of alice's message", o, err, "author")
	wantText(t, "bob after carol's edit", bob.read(t, conv), a5.Seq, "meet at 10, gate A")
	// The same edit shown as alice's rewritten message.
	target := msgAt(t, bob, conv, a5.Seq)
	target.Edited, target.Body = true, forged
	if o, err := bob.m.Open(target); err == nil && o.Text != "meet at 10, gate A" {
		t.Fatalf("alice's message rewritten with carol's edit shows %q", o.Text)
	}
	// A device that kept nothing of alice's message: the rewritten
	// message is carol's edit, not alice's.
	bob2 := startDev(t, srv, "bob", "laptop", 5)
	if _, err := carol.m.SendGroup(ctx, conv, trio, "gate F it is"); err != nil { // carol's key reaches bob's laptop
		t.Fatal(err)
	}
	bob2.read(t, conv)
	forged2, _, err := carol.m.groupEnvelope(ctx, conv, trio, protocol.KindEdit, a5.Seq, content{T: "text", Text: "meet at 11, gate F"})
	if err != nil {
		t.Fatal(err)
	}
	target.Body = forged2
	if o, err := bob2.m.Open(target); err == nil || o.Text != "" {
		t.Fatalf("bob's laptop shows carol's edit as alice's message: %+v %v", o, err)
	}
}

// A sender key distribution and a group message of one group, replayed
// into another group with the same members.
func TestMaliciousServerReplaysIntoAnotherConversation(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice, bob, _, g7 := groupOf(t, srv)
	g8, err := alice.c.CreateGroupE2E(ctx, "other", []string{"bob", "carol"})
	if err != nil {
		t.Fatal(err)
	}
	m7, err := alice.m.SendGroup(ctx, g7, trio, "for group seven only")
	if err != nil {
		t.Fatal(err)
	}
	// bob never sees group 7's messages: the server moves them to 8.
	var skdm, msg protocol.Message
	for _, m := range bob.history(t, g7) {
		env, err := protocol.ParseEnvelope(m.Body)
		switch {
		case err != nil:
		case m.Seq == m7.Seq:
			msg = m
		case len(env.To) > 0 && m.Sender == "alice":
			skdm = m
		}
	}
	if skdm.Seq == 0 || msg.Seq == 0 {
		t.Fatalf("no distribution or message in group 7's history")
	}
	next := uint64(len(bob.history(t, g8.ConvID)) + 1)
	skdm.ConvID, skdm.Seq = g8.ConvID, next
	msg.ConvID, msg.Seq = g8.ConvID, next+1
	o, err := bob.m.Open(skdm)
	refused(t, "group 7's sender key in group 8", o, err, "conv")
	if o, err := bob.m.Open(msg); err == nil || o.Text != "" {
		t.Fatalf("group 7's message shown in group 8: %+v %v", o, err)
	}
	// Pairwise too: a direct message replayed into a group.
	d, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	a1, err := alice.m.SendDirect(ctx, d.ConvID, "bob", "just for bob")
	if err != nil {
		t.Fatal(err)
	}
	moved := msgAt(t, bob, d.ConvID, a1.Seq)
	moved.ConvID, moved.Seq = g8.ConvID, next+2
	o, err = bob.m.Open(moved)
	refused(t, "a direct message in group 8", o, err, "conv")
}

// A first message (which starts its own session, whoever the server says
// sent it) relabelled with another sender user or device.
func TestMaliciousServerRelabelsSender(t *testing.T) {
	for _, tc := range []struct {
		name, user, device, field string
	}{
		{"another user", "carol", "phone", "from"},
		{"another device", "alice", "laptop", "dev"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := servertest.Start(t)
			ctx := ctxT(t)
			alice := startDev(t, srv, "alice", "phone", 5)
			startDev(t, srv, "alice", "laptop", 5)
			bob := startDev(t, srv, "bob", "phone", 5)
			startDev(t, srv, "carol", "phone", 5)
			conv, err := alice.c.OpenDirectE2E(ctx, "bob")
			if err != nil {
				t.Fatal(err)
			}
			a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", "from alice's phone")
			if err != nil {
				t.Fatal(err)
			}
			m := msgAt(t, bob, conv.ConvID, a1.Seq) // withheld, then relabelled
			m.Sender, m.SenderDevice = tc.user, tc.device
			o, err := bob.m.Open(m)
			if err == nil || o.Text != "" {
				t.Fatalf("alice's first message shown as %s/%s's: %+v %v", tc.user, tc.device, o, err)
			}
			var me *MetadataError
			if errors.As(err, &me) && me.Field != tc.field {
				t.Fatalf("mismatch of %q (%v), want %q", me.Field, err, tc.field)
			}
		})
	}
}

// A ciphertext bob opened, delivered again under a new seq: pairwise, in
// a group, and this device's own message.
func TestMaliciousServerReplaysUnderNewSeq(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice, bob, _, g := groupOf(t, srv)
	d, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	a1, err := alice.m.SendDirect(ctx, d.ConvID, "bob", "pay carol 100")
	if err != nil {
		t.Fatal(err)
	}
	g1, err := alice.m.SendGroup(ctx, g, trio, "pay dave 50")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "bob", bob.read(t, d.ConvID), a1.Seq, "pay carol 100")
	wantText(t, "bob", bob.read(t, g), g1.Seq, "pay dave 50")
	for _, tc := range []struct {
		name string
		r    *dev
		conv uint64
		seq  uint64
	}{
		{"pairwise", bob, d.ConvID, a1.Seq},
		{"group", bob, g, g1.Seq},
		{"own", alice, d.ConvID, a1.Seq},
	} {
		m := msgAt(t, tc.r, tc.conv, tc.seq)
		if o, err := tc.r.m.Open(m); err != nil || o.Text == "" {
			t.Fatalf("%s: the genuine message again: %+v %v", tc.name, o, err)
		}
		m.Seq += 1000
		o, err := tc.r.m.Open(m)
		refused(t, tc.name+" replayed", o, err, "seq")
	}
}

// Kind and target relabelling of messages bob has not opened yet.
func TestMaliciousServerRelabelsKind(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	bob := startDev(t, srv, "bob", "phone", 5)
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	c := conv.ConvID
	send := func(text string) uint64 {
		t.Helper()
		a, err := alice.m.SendDirect(ctx, c, "bob", text)
		if err != nil {
			t.Fatal(err)
		}
		return a.Seq
	}
	first := send("first")
	second := send("second")
	wantText(t, "bob", bob.read(t, c), second, "second")
	texts := []uint64{send("text as edit"), send("text as recall"), send("text as state")}
	ed, err := alice.m.EditDirect(ctx, c, first, "bob", "first, edited")
	if err != nil {
		t.Fatal(err)
	}
	ed2, err := alice.m.EditDirect(ctx, c, second, "bob", "second, edited")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		seq    uint64
		kind   string
		target uint64
		field  string
	}{
		{"text as an edit", texts[0], protocol.KindEdit, first, "kind"},
		{"text as a recall", texts[1], protocol.KindRecall, first, "kind"},
		{"text as a state message", texts[2], protocol.KindState, 0, "kind"},
		{"edit as a new text", ed.Seq, protocol.KindText, 0, "kind"},
		{"edit of another target", ed2.Seq, protocol.KindEdit, first, "target"},
	} {
		m := msgAt(t, bob, c, tc.seq)
		m.Kind, m.TargetSeq = tc.kind, tc.target
		o, err := bob.m.Open(m)
		refused(t, tc.name, o, err, tc.field)
	}
	for seq, want := range map[uint64]string{first: "first", second: "second"} {
		if k, err := bob.m.loadKept(c, seq); err != nil || k == nil || k.Text != want {
			t.Fatalf("bob's copy of seq %d: %+v %v, want %q", seq, k, err, want)
		}
	}
}

// The server recalls alice's message: with no body (what moderation and
// old clients send), or with an envelope carol sealed. Neither is applied;
// alice's own recall is.
func TestMaliciousServerForgesRecall(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice, bob, carol, g := groupOf(t, srv)
	a1, err := alice.m.SendGroup(ctx, g, trio, "the door code is 4711")
	if err != nil {
		t.Fatal(err)
	}
	c1, err := carol.m.SendGroup(ctx, g, trio, "ok")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "bob", bob.read(t, g), a1.Seq, "the door code is 4711")
	last := bob.history(t, g)
	next := last[len(last)-1].Seq + 1

	bare := protocol.Message{ConvID: g, Seq: next, Sender: "alice", SenderDevice: "phone", Kind: protocol.KindRecall, TargetSeq: a1.Seq}
	if o, err := bob.m.Open(bare); !errors.Is(err, ErrUnauthenticatedRecall) {
		t.Fatalf("a recall without the author's envelope: %+v %v, want ErrUnauthenticatedRecall", o, err)
	}
	body, _, err := carol.m.groupEnvelope(ctx, g, trio, protocol.KindRecall, a1.Seq, content{T: "recall"})
	if err != nil {
		t.Fatal(err)
	}
	byCarol := msgAt(t, bob, g, c1.Seq)
	byCarol.Seq, byCarol.Kind, byCarol.TargetSeq, byCarol.Body = next+1, protocol.KindRecall, a1.Seq, body
	o, err := bob.m.Open(byCarol)
	refused(t, "carol's recall of alice's message", o, err, "author")
	// The target as the server now shows it: recalled, no body.
	target := msgAt(t, bob, g, a1.Seq)
	target.Recalled, target.Body = true, ""
	if o, err := bob.m.Open(target); err != nil || o.Recalled || o.Text != "the door code is 4711" {
		t.Fatalf("alice's message after forged recalls: %+v %v", o, err)
	}

	// alice's own recall goes through and is applied.
	rc, err := alice.m.RecallGroup(ctx, g, a1.Seq, trio)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := bob.m.Open(msgAt(t, bob, g, rc.Seq)); err != nil || o.Kind != protocol.KindRecall || o.TargetSeq != a1.Seq {
		t.Fatalf("alice's recall: %+v %v", o, err)
	}
	after := msgAt(t, bob, g, a1.Seq)
	if !after.Recalled || after.Body != "" {
		t.Fatalf("the server did not recall the target: %+v", after)
	}
	if o, err := bob.m.Open(after); err != nil || !o.Recalled || o.Text != "" {
		t.Fatalf("alice's message after her recall: %+v %v", o, err)
	}
	if hits, err := bob.m.Search("door code"); err != nil || len(hits) != 0 {
		t.Fatalf("search after the recall: %v %v", hits, err)
	}
	// alice's device opens its own recall's echo and the recalled target.
	if o, err := alice.m.Open(msgAt(t, alice, g, rc.Seq)); err != nil || o.Kind != protocol.KindRecall {
		t.Fatalf("alice's own recall: %+v %v", o, err)
	}
	if o, err := alice.m.Open(msgAt(t, alice, g, a1.Seq)); err != nil || !o.Recalled {
		t.Fatalf("alice's own recalled message: %+v %v", o, err)
	}
}

// The server takes a recall's body only in an E2E conversation, as an
// envelope; a recall without one stays possible there (moderation, clients
// that seal none) and a plaintext conversation's recall takes none.
func TestRecallBody(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	startDev(t, srv, "bob", "phone", 5)
	plain, err := alice.c.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	p1, err := alice.c.Send(ctx, plain.ConvID, "plain")
	if err != nil {
		t.Fatal(err)
	}
	e2e, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, text := range []string{"one", "two"} {
		a, err := alice.m.SendDirect(ctx, e2e.ConvID, "bob", text)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, a.Seq)
	}
	env := protocol.EncodeEnvelope(protocol.Envelope{Group: []byte{1}})
	for _, tc := range []struct {
		name string
		conv uint64
		seq  uint64
		body string
		want protocol.Code
	}{
		{"plaintext conversation, a body", plain.ConvID, p1.Seq, env, protocol.CodeInvalidArgument},
		{"E2E, a body that is no envelope", e2e.ConvID, seqs[0], "in clear", protocol.CodeE2ERequired},
		{"E2E, no body", e2e.ConvID, seqs[0], "", ""},
		{"E2E, an envelope", e2e.ConvID, seqs[1], env, ""},
		{"plaintext conversation, no body", plain.ConvID, p1.Seq, "", ""},
	} {
		_, err := alice.c.SendFrame(ctx, protocol.Frame{Type: protocol.TypeRecall, ConvID: tc.conv, TargetSeq: tc.seq, Body: tc.body})
		var ce *client.Error
		switch {
		case tc.want == "" && err != nil:
			t.Fatalf("%s: %v", tc.name, err)
		case tc.want != "" && (!errors.As(err, &ce) || ce.Code != tc.want):
			t.Fatalf("%s: %v, want %s", tc.name, err, tc.want)
		}
	}
	for _, m := range alice.history(t, e2e.ConvID) {
		if m.Kind == protocol.KindRecall && m.TargetSeq == seqs[1] && m.Body != env {
			t.Fatalf("the recall event lost its envelope: %+v", m)
		}
	}
}

// A content without the bound fields (sealed by an SDK before them, or
// so the server would like): a text is shown flagged, never kept; an edit
// or a sender key distribution is not applied.
func TestUnboundContent(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice, bob, _, g := groupOf(t, srv)
	d, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	a1, err := alice.m.SendDirect(ctx, d.ConvID, "bob", "genuine")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "bob", bob.read(t, d.ConvID), a1.Seq, "genuine")
	old := func(c content) string {
		t.Helper()
		plain, _ := json.Marshal(c)
		typ, ct, err := alice.m.Device().Encrypt(e2ee.Address{User: "bob", Device: "phone"}, plain)
		if err != nil {
			t.Fatal(err)
		}
		return protocol.EncodeEnvelope(protocol.Envelope{To: []protocol.EnvelopeTo{{User: "bob", Device: "phone", Type: int(typ), Body: ct}}})
	}
	base := msgAt(t, bob, d.ConvID, a1.Seq)

	text := base
	text.Seq, text.Body = a1.Seq+1, old(content{T: "text", Text: "from an old SDK"})
	o, err := bob.m.Open(text)
	if !errors.Is(err, ErrUnbound) || o.Text != "from an old SDK" {
		t.Fatalf("unbound text: %+v %v, want its text and ErrUnbound", o, err)
	}
	if k, err := bob.m.loadKept(d.ConvID, text.Seq); err != nil || k != nil {
		t.Fatalf("unbound text kept: %+v %v", k, err)
	}

	edit := base
	edit.Seq, edit.Kind, edit.TargetSeq, edit.Body = a1.Seq+2, protocol.KindEdit, a1.Seq, old(content{T: "text", Text: "edited by an old SDK"})
	if o, err := bob.m.Open(edit); !errors.Is(err, ErrUnbound) || o.Text != "" {
		t.Fatalf("unbound edit: %+v %v, want ErrUnbound and no text", o, err)
	}
	wantText(t, "bob after the unbound edit", bob.read(t, d.ConvID), a1.Seq, "genuine")

	skdm, err := alice.m.Device().GroupDistribution(groupName(g), e2ee.FormatModern)
	if err != nil {
		t.Fatal(err)
	}
	dist := base
	dist.ConvID, dist.Seq, dist.Body = g, 1000, old(content{T: "skdm", SKDM: skdm})
	if o, err := bob.m.Open(dist); !errors.Is(err, ErrUnbound) || o.Control {
		t.Fatalf("unbound distribution: %+v %v, want ErrUnbound", o, err)
	}
	ct, err := alice.m.Device().GroupEncrypt(groupName(g), []byte(`{"t":"text","text":"under the unbound key"}`), e2ee.FormatModern)
	if err != nil {
		t.Fatal(err)
	}
	gm := dist
	gm.Seq, gm.Body = 1001, protocol.EncodeEnvelope(protocol.Envelope{Group: ct})
	if o, err := bob.m.Open(gm); !errors.Is(err, e2ee.ErrNoSenderKey) {
		t.Fatalf("a message under the unbound sender key: %+v %v, want e2ee.ErrNoSenderKey", o, err)
	}
}
