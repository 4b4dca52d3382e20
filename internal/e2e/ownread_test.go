package e2e

import (
	"testing"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestOwnMessagesNeverUnread: a message sent over the WebSocket or the
// HTTP fallback moves the sender's read position to it, so the sender's
// conv_list never counts it; the peer's does. A send that moves the
// position past others' messages sends the read receipt a read would
// (docs/protocol.md, "Own messages are never unread").
func TestOwnMessagesNeverUnread(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "phone")
	bob := dialRaw(t, srv, "bob", "phone")
	conv := alice.openDirect("bob")
	row := func(c *rawConn) protocol.ConvSummary {
		t.Helper()
		l := mustOK(t, c.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List
		if len(l) != 1 {
			t.Fatalf("conv_list %+v", l)
		}
		return l[0]
	}
	alice.sendText(conv, "w1", "over the websocket")
	alice.sendText(conv, "w2", "again")
	if s := row(alice); s.Unread != 0 || s.ReadSeq != 2 || s.LastSeq != 2 {
		t.Fatalf("alice's row after two sends %+v, want unread 0 read_seq 2", s)
	}
	if s := row(bob); s.Unread != 2 || s.ReadSeq != 0 {
		t.Fatalf("bob's row %+v, want unread 2", s)
	}

	// The HTTP fallback: the same for a send through /v1/rpc.
	web := &pollClient{t: t, base: srv.HTTPURL, token: srv.Token("alice"), device: "browser"}
	if status, frames := web.poll(0); status != 200 || len(frames) != 1 {
		t.Fatalf("opening poll: %d %+v", status, frames)
	} else {
		web.session = frames[0].Hello.SessionID
	}
	ack := mustOK(t, web.rpc(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "h1", Body: "over http"}), protocol.TypeAck)
	l := mustOK(t, web.rpc(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List
	if len(l) != 1 || l[0].Unread != 0 || l[0].ReadSeq != ack.Seq {
		t.Fatalf("alice's row over http after an http send %+v, want unread 0 read_seq %d", l, ack.Seq)
	}
	if s := row(bob); s.Unread != 3 {
		t.Fatalf("bob's row %+v, want unread 3", s)
	}
	// bob answers without reading: alice's count is bob's message only,
	// and bob's position passed over alice's messages, so alice gets the
	// read receipt a read would send. It is the first receipt she sees:
	// her own sends pushed none.
	bob.sendText(conv, "b1", "hi")
	if s := row(alice); s.Unread != 1 {
		t.Fatalf("alice's row after bob's answer %+v, want unread 1", s)
	}
	if s := row(bob); s.Unread != 0 || s.ReadSeq != 4 {
		t.Fatalf("bob's row after his answer %+v, want unread 0 read_seq 4", s)
	}
	if r := alice.next(protocol.TypeReceipt); r.State != protocol.StateRead || r.UserID != "bob" || r.Seq != 4 {
		t.Fatalf("alice's first receipt %+v, want bob's read at 4", r)
	}
	// bob's next message follows his own: no receipt. alice's read
	// sends hers as always.
	bob.sendText(conv, "b2", "again")
	mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeRead, ConvID: conv, Seq: 5}), protocol.TypeOK)
	if r := alice.next(protocol.TypeReceipt); r.UserID != "alice" || r.Seq != 5 {
		t.Fatalf("alice's next receipt %+v, want her own read at 5 (none for bob's second message)", r)
	}
}
