package e2e

import (
	"testing"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestConvListCarriesPeerPositions: a direct conversation's summary says
// how far the peer has received and read it, so a device that connects
// after the receipts went out (a new tab, a reload) shows the same states
// as one that saw them; a group's summary carries neither.
func TestConvListCarriesPeerPositions(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "phone")
	bob := dialRaw(t, srv, "bob", "phone")
	conv := alice.openDirect("bob")
	row := func(c *rawConn, conv uint64) protocol.ConvSummary {
		t.Helper()
		for _, s := range mustOK(t, c.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List {
			if s.ConvID == conv {
				return s
			}
		}
		t.Fatalf("conv %d not in the list", conv)
		return protocol.ConvSummary{}
	}
	for _, b := range []string{"one", "two", "three"} {
		alice.sendText(conv, "a"+b, b)
	}
	if s := row(alice, conv); s.PeerReadSeq != 0 || s.PeerDeliveredSeq != 0 {
		t.Fatalf("before bob saw anything: %+v", s)
	}
	// bob receives up to 3, reads up to 2.
	mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeDelivered, ConvID: conv, Seq: 3}), protocol.TypeOK)
	mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeRead, ConvID: conv, Seq: 2}), protocol.TypeOK)
	// A device of alice's that was not connected for the receipts.
	late := dialRaw(t, srv, "alice", "laptop")
	if s := row(late, conv); s.PeerDeliveredSeq != 3 || s.PeerReadSeq != 2 || s.Peer != "bob" {
		t.Fatalf("alice's late device: %+v, want peer_delivered_seq 3 peer_read_seq 2", s)
	}
	// bob's own row names alice's positions: her sends moved her read.
	if s := row(bob, conv); s.PeerReadSeq != 3 || s.PeerDeliveredSeq != 3 {
		t.Fatalf("bob's row: %+v, want alice's positions 3/3", s)
	}
	// Reading beyond delivered raises both.
	mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeRead, ConvID: conv, Seq: 3}), protocol.TypeOK)
	if s := row(late, conv); s.PeerReadSeq != 3 || s.PeerDeliveredSeq != 3 {
		t.Fatalf("after bob read everything: %+v", s)
	}
	// Groups carry no peer positions.
	g := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "g", Members: []string{"bob"}}), protocol.TypeConv).Conv.ConvID
	alice.sendText(g, "g1", "hi group")
	mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeRead, ConvID: g, Seq: 2}), protocol.TypeOK)
	if s := row(alice, g); s.PeerReadSeq != 0 || s.PeerDeliveredSeq != 0 {
		t.Fatalf("a group's row: %+v", s)
	}
}
