package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestAckPolicyFollowsTier: a push says how to acknowledge it by its
// conversation's tier — a direct conversation's and a small group's carry
// no ack field and a medium group's "batch", and those are re-sent until a
// delivered covers them; a large group's carry "none" and are never
// re-sent. One delivered frame with positions acknowledges several
// conversations at once, and the direct peer gets its delivered receipt.
func TestAckPolicyFollowsTier(t *testing.T) {
	srv := servertest.Start(t,
		servertest.WithChat(func(c *chat.Config) { c.SmallBelow, c.LargeAbove, c.Hysteresis = 3, 4, 0.25 }),
		servertest.WithGateway(func(g *gateway.Config) { g.RetransmitAfter = 300 * time.Millisecond; g.RetransmitMax = 3 }))
	alice := dialRaw(t, srv, "alice", "phone")
	bob := dialRaw(t, srv, "bob", "phone")
	direct := alice.openDirect("bob")
	small := alice.createGroup("small", "bob")               // 2 members
	medium := alice.createGroup("medium", "bob", "carol")    // 3
	large := alice.createGroup("large", users("u", 0, 4)...) // alice + 4 users + bob below
	alice.addMembers(large, "bob")
	// The system events of the groups' creation were pushed too; drain and
	// acknowledge them so what follows counts only the messages below.
	convs := map[uint64]string{direct: "direct", small: "small", medium: "medium", large: "large"}
	want := map[uint64]string{direct: "", small: "", medium: protocol.AckBatch, large: protocol.AckNone}
	last := map[uint64]uint64{}
	for conv := range convs {
		last[conv] = mustOK(t, alice.sendText(conv, fmt.Sprint("c", conv), "hi "+convs[conv]), protocol.TypeAck).Seq
	}
	// First pushes of the four messages, then re-sends for 1.5 s without
	// any ack.
	pushes := map[uint64]int{}
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		f := bob.nextTimeout(protocol.TypeMsg, time.Until(deadline))
		if f == nil {
			break
		}
		m := f.Message
		if m.Seq != last[m.ConvID] {
			continue // a system event of the group's creation
		}
		if f.Ack != want[m.ConvID] {
			t.Fatalf("%s push: ack %q, want %q", convs[m.ConvID], f.Ack, want[m.ConvID])
		}
		pushes[m.ConvID]++
	}
	for conv, name := range convs {
		switch n := pushes[conv]; {
		case conv == large && n != 1:
			t.Fatalf("large group's push arrived %d times, want once (untracked: never re-sent)", n)
		case conv != large && n < 2:
			t.Fatalf("%s push arrived %d times, want re-sends until acknowledged", name, n)
		}
	}
	// One frame acknowledges the three tracked conversations.
	mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeDelivered, Positions: []protocol.Position{
		{ConvID: direct, Seq: last[direct]}, {ConvID: small, Seq: last[small]}, {ConvID: medium, Seq: last[medium]},
	}}), protocol.TypeOK)
	if r := alice.next(protocol.TypeReceipt); r.State != protocol.StateDelivered || r.ConvID != direct || r.Seq != last[direct] || r.UserID != "bob" {
		t.Fatalf("alice receipt = %+v, want bob delivered %d in the direct conversation", r, last[direct])
	}
	// Nothing is re-sent any more.
	for {
		f := bob.nextTimeout(protocol.TypeMsg, time.Second)
		if f == nil {
			break
		}
		if f.Message.Seq == last[f.Message.ConvID] {
			t.Fatalf("%s push re-sent after the delivered positions", convs[f.Message.ConvID])
		}
	}
	// conv_id with positions, an empty entry, and too many entries are refused.
	for _, bad := range []protocol.Frame{
		{Type: protocol.TypeDelivered, ConvID: direct, Seq: 1, Positions: []protocol.Position{{ConvID: small, Seq: 1}}},
		{Type: protocol.TypeDelivered, Positions: []protocol.Position{{ConvID: small}}},
	} {
		if r := bob.call(bad); r.Type != protocol.TypeError || r.Code != protocol.CodeInvalidArgument {
			t.Fatalf("delivered %+v answered %s %s, want invalid_argument", bad.Positions, r.Type, r.Code)
		}
	}
	many := make([]protocol.Position, bob.hello.Limits.MaxSyncConvs+1)
	for i := range many {
		many[i] = protocol.Position{ConvID: direct, Seq: 1}
	}
	if r := bob.call(protocol.Frame{Type: protocol.TypeDelivered, Positions: many}); r.Code != protocol.CodeTooLarge {
		t.Fatalf("delivered with %d positions answered %s %s, want too_large", len(many), r.Type, r.Code)
	}
	// A position in a conversation bob is not in fails the frame, after
	// the others were applied.
	if r := bob.call(protocol.Frame{Type: protocol.TypeDelivered, Positions: []protocol.Position{{ConvID: direct, Seq: last[direct]}, {ConvID: 1 << 50, Seq: 1}}}); r.Code != protocol.CodeNotMember {
		t.Fatalf("delivered in a foreign conversation answered %s %s, want not_member", r.Type, r.Code)
	}
}
