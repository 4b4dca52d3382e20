// Package e2e tests a real node end to end, as its clients see it: each
// test starts its own in-process server (servertest: real listener, real
// Pebble store on disk) and talks to it over real WebSockets, HTTP polling
// and the server API, byte for byte with rawConn rather than through the
// SDK, so the SDK's retries and ordering hide nothing. Every frame and
// server API answer a test reads is validated against protocol/schema.
// Tests share no server and no state.
package e2e

import (
	"testing"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

func TestDirectSendPushAck(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "phone")
	bob := dialRaw(t, srv, "bob", "phone")
	conv := alice.openDirect("bob")
	ack := mustOK(t, alice.sendText(conv, "c1", "hello bob"), protocol.TypeAck)
	if ack.Seq != 1 || ack.MsgID == 0 || ack.Duplicate {
		t.Fatalf("ack = %+v, want seq 1, a msg id, not duplicate", ack)
	}
	m := bob.next(protocol.TypeMsg).Message
	if m.Body != "hello bob" || m.Seq != 1 || m.Sender != "alice" {
		t.Fatalf("bob got %+v", m)
	}
	// The sender's own connection gets the push too.
	if m := alice.next(protocol.TypeMsg).Message; m.Seq != 1 {
		t.Fatalf("alice push seq %d, want 1", m.Seq)
	}
}
