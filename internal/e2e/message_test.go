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

// history returns every message of conv visible to c, ascending.
func (c *rawConn) history(conv uint64) []protocol.Message {
	c.t.Helper()
	var out []protocol.Message
	after := uint64(0)
	for {
		r := mustOK(c.t, c.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, AfterSeq: &after, Limit: 200}), protocol.TypeHistory)
		out = append(out, r.Messages...)
		if !r.HasMore {
			return out
		}
		after = out[len(out)-1].Seq
	}
}

func TestRetryAfterDroppedAckStoresOnce(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "phone")
	conv := alice.openDirect("bob")
	// Send, then drop the connection without reading the ack: the client
	// cannot know whether the message was stored.
	alice.send(protocol.Frame{Type: protocol.TypeSend, RID: "x", ConvID: conv, ClientMsgID: "once", Body: "hi"})
	alice.next(protocol.TypeAck)
	_ = alice.ws.Close()

	again := dialRaw(t, srv, "alice", "phone")
	ack := mustOK(t, again.sendText(conv, "once", "hi"), protocol.TypeAck)
	if !ack.Duplicate || ack.Seq != 1 {
		t.Fatalf("retry ack = %+v, want duplicate of seq 1", ack)
	}
	// A retry on another device of the same user is the same message too.
	laptop := dialRaw(t, srv, "alice", "laptop")
	if ack := mustOK(t, laptop.sendText(conv, "once", "hi"), protocol.TypeAck); !ack.Duplicate || ack.Seq != 1 {
		t.Fatalf("retry from another device = %+v, want duplicate of seq 1", ack)
	}
	if got := again.history(conv); len(got) != 1 {
		t.Fatalf("history has %d messages, want exactly 1", len(got))
	}
	next := mustOK(t, again.sendText(conv, "two", "next"), protocol.TypeAck)
	if next.Seq != 2 {
		t.Fatalf("next seq = %d, want 2 (no seq consumed by the retries)", next.Seq)
	}
}

func TestTwoDevicesConverge(t *testing.T) {
	srv := servertest.Start(t)
	phone := dialRaw(t, srv, "alice", "phone")
	laptop := dialRaw(t, srv, "alice", "laptop")
	bob := dialRaw(t, srv, "bob", "web")
	conv := bob.openDirect("alice")
	for i := 1; i <= 20; i++ {
		c := bob
		if i%4 == 0 {
			c = phone // alice's own sends reach her other device too
		}
		mustOK(t, c.sendText(conv, cmid(i), fmt.Sprintf("m%d", i)), protocol.TypeAck)
	}
	// Each device gets every message; pushes of different senders may
	// arrive out of seq order (the client orders by seq), so compare sets.
	for _, dev := range []*rawConn{phone, laptop, bob} {
		got := map[uint64]string{}
		for len(got) < 20 {
			m := dev.next(protocol.TypeMsg).Message
			if prev, dup := got[m.Seq]; dup && prev != m.Body {
				t.Fatalf("%s: seq %d arrived as %q and %q", dev.hello.DeviceID, m.Seq, prev, m.Body)
			}
			got[m.Seq] = m.Body
		}
		for seq := uint64(1); seq <= 20; seq++ {
			if got[seq] != fmt.Sprintf("m%d", seq) {
				t.Fatalf("%s: seq %d is %q, want %q", dev.hello.DeviceID, seq, got[seq], fmt.Sprintf("m%d", seq))
			}
		}
	}
}

func TestReadOnOneDeviceClearsOther(t *testing.T) {
	srv := servertest.Start(t)
	phone := dialRaw(t, srv, "alice", "phone")
	laptop := dialRaw(t, srv, "alice", "laptop")
	bob := dialRaw(t, srv, "bob", "web")
	conv := bob.openDirect("alice")
	for i := 1; i <= 5; i++ {
		mustOK(t, bob.sendText(conv, cmid(i), "x"), protocol.TypeAck)
	}
	if l := mustOK(t, laptop.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List; len(l) != 1 || l[0].Unread != 5 {
		t.Fatalf("laptop list before read = %+v, want one conv with 5 unread", l)
	}
	mustOK(t, phone.call(protocol.Frame{Type: protocol.TypeRead, ConvID: conv, Seq: 5}), protocol.TypeOK)
	r := laptop.next(protocol.TypeReceipt)
	if r.State != protocol.StateRead || r.UserID != "alice" || r.Seq != 5 {
		t.Fatalf("laptop receipt = %+v, want alice read 5", r)
	}
	if r := bob.next(protocol.TypeReceipt); r.State != protocol.StateDelivered && r.State != protocol.StateRead {
		t.Fatalf("bob receipt = %+v", r)
	}
	l := mustOK(t, laptop.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List
	if l[0].Unread != 0 || l[0].ReadSeq != 5 || l[0].LastMessage == nil || l[0].Peer != "bob" {
		t.Fatalf("laptop list after read = %+v, want unread 0, read 5, a last message, peer bob", l[0])
	}
	// Reading never moves backwards.
	mustOK(t, laptop.call(protocol.Frame{Type: protocol.TypeRead, ConvID: conv, Seq: 2}), protocol.TypeOK)
	if l := mustOK(t, phone.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List; l[0].ReadSeq != 5 {
		t.Fatalf("read position = %d after reading 2, want 5", l[0].ReadSeq)
	}
}

func TestEditAndRecall(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "phone")
	bob := dialRaw(t, srv, "bob", "phone")
	conv := alice.openDirect("bob")
	mustOK(t, alice.sendText(conv, "a1", "original"), protocol.TypeAck)
	edit := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeEdit, ConvID: conv, ClientMsgID: "e1", TargetSeq: 1, Body: "fixed"}), protocol.TypeAck)
	if edit.Seq != 2 {
		t.Fatalf("edit seq = %d, want 2 (events take a seq)", edit.Seq)
	}
	bob.next(protocol.TypeMsg)
	if ev := bob.next(protocol.TypeMsg).Message; ev.Kind != protocol.KindEdit || ev.TargetSeq != 1 || ev.Body != "fixed" {
		t.Fatalf("bob edit event = %+v", ev)
	}
	tests := []struct {
		name string
		c    *rawConn
		f    protocol.Frame
		want protocol.Code
	}{
		{"other user edits", bob, protocol.Frame{Type: protocol.TypeEdit, ConvID: conv, ClientMsgID: "b1", TargetSeq: 1, Body: "x"}, protocol.CodeForbidden},
		{"edit an event", alice, protocol.Frame{Type: protocol.TypeEdit, ConvID: conv, ClientMsgID: "e2", TargetSeq: 2, Body: "x"}, protocol.CodeConflict},
		{"target past the end", alice, protocol.Frame{Type: protocol.TypeRecall, ConvID: conv, ClientMsgID: "r9", TargetSeq: 99}, protocol.CodeNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.c.call(tc.f)
			if r.Type != protocol.TypeError || r.Code != tc.want {
				t.Fatalf("got %s %s, want error %s", r.Type, r.Code, tc.want)
			}
		})
	}
	mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeRecall, ConvID: conv, ClientMsgID: "r1", TargetSeq: 1}), protocol.TypeAck)
	if r := alice.call(protocol.Frame{Type: protocol.TypeEdit, ConvID: conv, ClientMsgID: "e3", TargetSeq: 1, Body: "y"}); r.Code != protocol.CodeConflict {
		t.Fatalf("edit after recall = %s %s, want conflict", r.Type, r.Code)
	}
	h := bob.history(conv)
	if len(h) != 3 {
		t.Fatalf("history has %d entries, want 3 (message, edit, recall): refused requests must store nothing", len(h))
	}
	if !h[0].Recalled || h[0].Body != "" || !h[0].Edited {
		t.Fatalf("target after recall = %+v, want recalled with empty body", h[0])
	}
}

func TestEditWindow(t *testing.T) {
	srv := servertest.Start(t, servertest.WithChat(func(c *chat.Config) { c.RecallWindow = time.Millisecond }))
	alice := dialRaw(t, srv, "alice", "phone")
	conv := alice.openDirect("bob")
	mustOK(t, alice.sendText(conv, "a1", "x"), protocol.TypeAck)
	time.Sleep(20 * time.Millisecond)
	if r := alice.call(protocol.Frame{Type: protocol.TypeRecall, ConvID: conv, ClientMsgID: "r1", TargetSeq: 1}); r.Code != protocol.CodeRecallExpired {
		t.Fatalf("late recall = %s %s, want %s", r.Type, r.Code, protocol.CodeRecallExpired)
	}
}

func TestUnackedPushIsResent(t *testing.T) {
	srv := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) { g.RetransmitAfter = 500 * time.Millisecond; g.RetransmitMax = 2 }))
	alice := dialRaw(t, srv, "alice", "phone")
	bob := dialRaw(t, srv, "bob", "phone")
	conv := alice.openDirect("bob")
	mustOK(t, alice.sendText(conv, "a1", "x"), protocol.TypeAck)
	first := bob.next(protocol.TypeMsg).Message
	again := bob.next(protocol.TypeMsg).Message // no delivered ack: re-sent
	if again.Seq != first.Seq || again.MsgID != first.MsgID {
		t.Fatalf("re-sent %+v, want the same message %+v", again, first)
	}
	bob.send(protocol.Frame{Type: protocol.TypeDelivered, ConvID: conv, Seq: first.Seq})
	if r := alice.next(protocol.TypeReceipt); r.State != protocol.StateDelivered || r.UserID != "bob" || r.Seq != 1 {
		t.Fatalf("alice receipt = %+v, want bob delivered 1", r)
	}
	// Once acked, nothing more arrives.
	mustOK(t, bob.call(protocol.Frame{Type: protocol.TypePing}), protocol.TypePong)
	select {
	case f := <-bob.in:
		if f.Type == protocol.TypeMsg {
			t.Fatalf("push re-sent after delivered ack: %+v", f.Message)
		}
	case <-time.After(2500 * time.Millisecond):
	}
}
