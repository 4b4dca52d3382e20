package e2e

import (
	"testing"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestCoalesceKeyIsScopedToItsSender: a second member sending a state with
// the same coalesce_key starts a state of its own; the first sender's state
// stays readable with its body, and each sender's newer state supersedes
// only its own older one. Clients see the key as sent.
func TestCoalesceKeyIsScopedToItsSender(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "d")
	bob := dialRaw(t, srv, "bob", "d")
	conv := alice.createGroup("g", "bob", "reader")
	state := func(c *rawConn, id, body string) {
		mustOK(t, c.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: id, Kind: protocol.KindState, CoalesceKey: "packet", Body: body}), protocol.TypeAck)
	}
	state(alice, "a1", "alice-1")
	state(bob, "b1", "bob-1")
	state(alice, "a2", "alice-2")

	s := snapshotOf(t, srv, "reader", conv)
	if s == nil {
		t.Fatal("no snapshot")
	}
	got := map[string]protocol.Message{}
	var superseded []string
	for _, m := range s.Messages {
		if m.Kind != protocol.KindState {
			continue
		}
		if m.CoalesceKey != "packet" {
			t.Fatalf("coalesce_key %q, want the key as sent", m.CoalesceKey)
		}
		if m.Superseded {
			superseded = append(superseded, m.ClientMsgID)
			continue
		}
		got[m.ClientMsgID] = m
	}
	if got["b1"].Body != "bob-1" || got["a2"].Body != "alice-2" {
		t.Fatalf("latest states: %+v; want bob-1 and alice-2 with their bodies", got)
	}
	if len(superseded) != 1 || superseded[0] != "a1" {
		t.Fatalf("superseded %v, want only alice's first state", superseded)
	}
}
