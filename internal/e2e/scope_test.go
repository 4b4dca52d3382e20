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

// TestReadPerDeviceScope: with read_scope=device, reading on the phone
// leaves the laptop's badge alone.
func TestReadPerDeviceScope(t *testing.T) {
	srv := servertest.Start(t, servertest.WithChat(func(c *chat.Config) { c.ReadScope = chat.ReadPerDevice }))
	phone := dialRaw(t, srv, "alice", "phone")
	laptop := dialRaw(t, srv, "alice", "laptop")
	bob := dialRaw(t, srv, "bob", "web")
	conv := bob.openDirect("alice")
	for i := 1; i <= 3; i++ {
		mustOK(t, bob.sendText(conv, cmid(i), "x"), protocol.TypeAck)
	}
	mustOK(t, phone.call(protocol.Frame{Type: protocol.TypeRead, ConvID: conv, Seq: 3}), protocol.TypeOK)
	if l := mustOK(t, phone.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List; l[0].Unread != 0 {
		t.Fatalf("phone unread = %d, want 0", l[0].Unread)
	}
	if l := mustOK(t, laptop.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List; l[0].Unread != 3 {
		t.Fatalf("laptop unread = %d, want 3 (per-device read positions)", l[0].Unread)
	}
}

// TestLaggingDeviceIsResentOnlyLatestState: a device that does not ack
// state updates is re-sent only the newest state of a key.
func TestLaggingDeviceIsResentOnlyLatestState(t *testing.T) {
	srv := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) { g.RetransmitAfter = 300 * time.Millisecond }))
	owner := dialRaw(t, srv, "owner", "d")
	conv := owner.createGroup("sale", "lagger")
	lag := dialRaw(t, srv, "lagger", "d")
	for i := 1; i <= 5; i++ {
		mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: fmt.Sprint("s", i), Kind: protocol.KindState, CoalesceKey: "stock", Body: fmt.Sprint(100 - i)}), protocol.TypeAck)
	}
	first := map[uint64]bool{}
	for len(first) < 5 {
		f := lag.next(protocol.TypeMsg)
		first[f.Message.Seq] = true
	}
	// Re-sends: only the latest state (seq 5) comes again.
	deadline := time.After(2 * time.Second)
	resent := map[uint64]int{}
loop:
	for {
		select {
		case f := <-lag.in:
			if f.Type == protocol.TypeMsg {
				resent[f.Message.Seq]++
			}
		case <-deadline:
			break loop
		}
	}
	if len(resent) != 1 || resent[5] == 0 {
		t.Fatalf("re-sent seqs %v, want only the latest state (seq 5)", resent)
	}
}
