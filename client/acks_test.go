package client

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// ackTiers makes groups of 3–4 members medium and larger ones large, and
// re-sends unacknowledged pushes quickly, so a test sees a re-send if one
// is made.
func ackTiers(t *testing.T) *servertest.Server {
	return servertest.Start(t,
		servertest.WithChat(func(c *chat.Config) { c.SmallBelow, c.LargeAbove, c.Hysteresis = 3, 4, 0.25 }),
		servertest.WithGateway(func(g *gateway.Config) { g.RetransmitAfter = 300 * time.Millisecond }))
}

// acked reports whether any delivered frame the client sent names conv.
func acked(frames []protocol.Frame, conv uint64) bool {
	for _, f := range frames {
		if f.ConvID == conv || slices.ContainsFunc(f.Positions, func(p protocol.Position) bool { return p.ConvID == conv }) {
			return true
		}
	}
	return false
}

// TestLargeGroupDroppedPushesFilledBySeq: a large group's pushes are
// untracked. Pushes lost on the way leave holes the client fills from
// history, every message is handed over once and in order, the client
// acknowledges none of them, and the server re-sends none.
func TestLargeGroupDroppedPushesFilledBySeq(t *testing.T) {
	srv := ackTiers(t)
	px := newProxy(t, srv.URL)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "d1", nil)
	bob := startE2E(t, px.url(), srv.Token("bob"), "d1", nil)
	ctx := ctxT(t)
	g, err := alice.CreateGroup(ctx, "big", []string{"bob", "u1", "u2", "u3", "u4"})
	if err != nil {
		t.Fatal(err)
	}
	first := g.LastSeq + 1
	lost := map[uint64]bool{first + 2: true, first + 3: true, first + 7: true, first + 11: true}
	px.setRule(func(dir direction, f *protocol.Frame) verdict {
		if dir == toClient && f.Type == protocol.TypeMsg && f.Message.ConvID == g.ConvID && lost[f.Message.Seq] {
			return drop
		}
		return pass
	})
	var last uint64
	for i := range 15 {
		a, err := alice.Send(ctx, g.ConvID, fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		last = a.Seq
	}
	eventually(t, "every message", func() bool { s := bob.rec.seqs(g.ConvID); return len(s) > 0 && s[len(s)-1] == last })
	seqs := bob.rec.seqs(g.ConvID)
	wantRun(t, seqs[slices.Index(seqs, first):], first, last)
	if !slices.ContainsFunc(px.sent(protocol.TypeHistory), func(f protocol.Frame) bool { return f.ConvID == g.ConvID }) {
		t.Fatal("holes filled without a history request")
	}
	time.Sleep(time.Second) // several re-send periods
	for _, s := range px.seen(toClient, protocol.TypeMsg) {
		if m := s.f.Message; m.ConvID == g.ConvID && s.f.Ack != protocol.AckNone {
			t.Fatalf("large group push %d has ack %q, want none", m.Seq, s.f.Ack)
		}
	}
	pushes := map[uint64]int{}
	for _, f := range px.framesOf(toClient, protocol.TypeMsg) {
		if f.Message.ConvID == g.ConvID {
			pushes[f.Message.Seq]++
		}
	}
	for seq := first; seq <= last; seq++ {
		if pushes[seq] != 1 {
			t.Fatalf("seq %d pushed %d times, want once (untracked pushes are never re-sent)", seq, pushes[seq])
		}
	}
	if acked(px.sent(protocol.TypeDelivered), g.ConvID) {
		t.Fatal("the client acknowledged a large group's pushes")
	}
}

// TestMediumGroupAcksBatchedAcrossConversations: medium groups' pushes
// (ack "batch") are acknowledged together, one delivered frame with the
// positions of both groups, up to their last seqs, so nothing is re-sent;
// a direct conversation's receipt still reaches the sender.
func TestMediumGroupAcksBatchedAcrossConversations(t *testing.T) {
	srv := ackTiers(t)
	px := newProxy(t, srv.URL)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "d1", nil)
	_ = startE2E(t, px.url(), srv.Token("bob"), "d1", nil)
	ctx := ctxT(t)
	var groups []uint64
	for _, name := range []string{"g1", "g2"} {
		g, err := alice.CreateGroup(ctx, name, []string{"bob", "carol"})
		if err != nil {
			t.Fatal(err)
		}
		groups = append(groups, g.ConvID)
	}
	direct, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	lastOf := map[uint64]uint64{}
	for i := range 6 {
		for _, conv := range groups {
			a, err := alice.Send(ctx, conv, fmt.Sprint(i))
			if err != nil {
				t.Fatal(err)
			}
			lastOf[conv] = a.Seq
		}
	}
	d, err := alice.Send(ctx, direct.ConvID, "hi")
	if err != nil {
		t.Fatal(err)
	}
	covered := func(conv, seq uint64) bool {
		for _, f := range px.sent(protocol.TypeDelivered) {
			if f.ConvID == conv && f.Seq >= seq || slices.ContainsFunc(f.Positions, func(p protocol.Position) bool { return p.ConvID == conv && p.Seq >= seq }) {
				return true
			}
		}
		return false
	}
	eventually(t, "both groups acknowledged to their last seq", func() bool {
		return covered(groups[0], lastOf[groups[0]]) && covered(groups[1], lastOf[groups[1]])
	})
	eventually(t, "alice's delivered receipt", func() bool {
		evs, _ := alice.rec.all(EventReceipt)
		return slices.ContainsFunc(evs, func(ev Event) bool {
			return ev.Receipt.ConvID == direct.ConvID && ev.Receipt.State == protocol.StateDelivered && ev.Receipt.Seq >= d.Seq
		})
	})
	both := false
	for _, f := range px.sent(protocol.TypeDelivered) {
		if acked([]protocol.Frame{{Positions: f.Positions}}, groups[0]) && acked([]protocol.Frame{{Positions: f.Positions}}, groups[1]) {
			both = true
		}
	}
	if !both {
		t.Fatalf("no delivered frame acknowledged both groups: %+v", px.sent(protocol.TypeDelivered))
	}
	for _, f := range px.framesOf(toClient, protocol.TypeMsg) {
		if slices.Contains(groups, f.Message.ConvID) && f.Ack != protocol.AckBatch {
			t.Fatalf("medium group push %d has ack %q, want batch", f.Message.Seq, f.Ack)
		}
	}
}
