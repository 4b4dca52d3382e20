package e2eechat

import (
	"fmt"
	"testing"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

func TestE2EGroupConversation(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	aliceLaptop := startDev(t, srv, "alice", "laptop", 5)
	bob := startDev(t, srv, "bob", "phone", 5)
	carol := startDev(t, srv, "carol", "phone", 5)

	g, err := alice.c.CreateGroupE2E(ctx, "secret", []string{"bob", "carol"})
	if err != nil || !g.E2E {
		t.Fatalf("create E2E group: %+v %v", g, err)
	}
	members := []string{"alice", "bob", "carol"}
	m1, err := alice.m.SendGroup(ctx, g.ConvID, members, canary+" to the group")
	if err != nil {
		t.Fatal(err)
	}
	r1, err := bob.m.SendGroup(ctx, g.ConvID, members, canary+" bob answers")
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]*dev{"bob": bob, "carol": carol, "alice's laptop": aliceLaptop} {
		got := d.read(t, g.ConvID)
		wantText(t, name, got, m1.Seq, canary+" to the group")
		wantText(t, name, got, r1.Seq, canary+" bob answers")
	}
	// Each group message is one ciphertext for everyone.
	for _, m := range alice.history(t, g.ConvID) {
		if m.Seq == m1.Seq || m.Seq == r1.Seq {
			env, err := protocol.ParseEnvelope(m.Body)
			if err != nil || len(env.To) != 0 || len(env.Group) == 0 {
				t.Fatalf("group message %d: %+v %v", m.Seq, env, err)
			}
		}
	}

	// Carol is removed: everyone rotates on the event; what is sent after
	// cannot be opened with what Carol holds.
	if _, err := alice.c.RemoveMembers(ctx, g.ConvID, []string{"carol"}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*dev{alice, bob, aliceLaptop} {
		d.read(t, g.ConvID) // sees member_removed
	}
	members = []string{"alice", "bob"}
	m2, err := alice.m.SendGroup(ctx, g.ConvID, members, canary+" after carol left")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "bob", bob.read(t, g.ConvID), m2.Seq, canary+" after carol left")
	var after protocol.Message
	for _, m := range bob.history(t, g.ConvID) {
		if m.Seq == m2.Seq {
			after = m
		}
	}
	if o, err := carol.m.Open(after); err == nil {
		t.Fatalf("removed member opened a message sent after the rotation: %q", o.Text)
	}

	// Dave joins later: he reads what comes after, not what came before.
	dave := startDev(t, srv, "dave", "phone", 5)
	if _, err := alice.c.AddMembers(ctx, g.ConvID, []string{"dave"}); err != nil {
		t.Fatal(err)
	}
	members = []string{"alice", "bob", "dave"}
	m3, err := alice.m.SendGroup(ctx, g.ConvID, members, canary+" welcome dave")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "dave", dave.read(t, g.ConvID), m3.Seq, canary+" welcome dave")
	for _, m := range alice.history(t, g.ConvID) {
		if m.Seq == m1.Seq || m.Seq == m2.Seq {
			if o, err := dave.m.Open(m); err == nil {
				t.Fatalf("a new member opened an earlier message: %q", o.Text)
			}
		}
	}
}

// A 1,000-member E2E group: a message is stored once, as one ciphertext,
// whatever the number of members (and of devices).
func TestE2EThousandMemberGroupOneCiphertext(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 2)
	bob := startDev(t, srv, "bob", "phone", 2)
	carol := startDev(t, srv, "carol", "phone", 2)
	members := []string{"alice", "bob", "carol"}
	for i := 0; len(members) < 1000; i++ {
		members = append(members, fmt.Sprintf("user%04d", i))
	}
	g, err := alice.c.CreateGroupE2E(ctx, "big", members[1:])
	if err != nil || g.MemberCount != 1000 {
		t.Fatalf("create: %+v %v", g, err)
	}
	var sizes []int
	for i := 0; i < 3; i++ {
		ack, err := alice.m.SendGroup(ctx, g.ConvID, members, fmt.Sprint(canary, " message ", i))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range alice.history(t, g.ConvID) {
			if m.Seq == ack.Seq {
				env, err := protocol.ParseEnvelope(m.Body)
				if err != nil || len(env.To) != 0 || len(env.Group) == 0 {
					t.Fatalf("message %d is not one group ciphertext: %v", i, err)
				}
				sizes = append(sizes, len(m.Body))
			}
		}
		for _, d := range []*dev{bob, carol} {
			wantText(t, "member", d.read(t, g.ConvID), ack.Seq, fmt.Sprint(canary, " message ", i))
		}
	}
	// One ciphertext of the content (text, its bound metadata and the
	// sender's key transparency head, about 60 bytes), not one per member.
	if len(sizes) != 3 || sizes[0] > 500 || sizes[0] != sizes[1] || sizes[1] != sizes[2] {
		t.Fatalf("group message bodies of %v bytes", sizes)
	}
}

// The sender's own device opens its own messages (kept copies) and sees its
// distributions as control messages.
func TestE2EOwnMessages(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 3)
	startDev(t, srv, "bob", "phone", 3)
	g, err := alice.c.CreateGroupE2E(ctx, "g", []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := alice.m.SendGroup(ctx, g.ConvID, []string{"alice", "bob"}, "mine")
	if err != nil {
		t.Fatal(err)
	}
	controls := 0
	for _, m := range alice.history(t, g.ConvID) {
		o, err := alice.m.Open(m)
		if err != nil {
			t.Fatalf("own message %d: %v", m.Seq, err)
		}
		if o.Control {
			controls++
		}
		if m.Seq == ack.Seq && o.Text != "mine" {
			t.Fatalf("own message read %q", o.Text)
		}
	}
	if controls != 1 {
		t.Fatalf("%d distribution messages, want 1", controls)
	}
}
