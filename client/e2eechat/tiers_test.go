package e2eechat

import (
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// E2E groups in every fan-out tier: pushes, sync and receipts carry the
// envelopes like any message, and every member device opens them.
func TestE2EGroupEveryTier(t *testing.T) {
	for _, tc := range []struct {
		name         string
		small, large int
	}{{"small", 200, 2000}, {"medium", 3, 2000}, {"large", 3, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := servertest.Start(t, servertest.WithChat(func(c *chat.Config) { c.SmallBelow, c.LargeAbove = tc.small, tc.large }))
			ctx := ctxT(t)
			alice := startDev(t, srv, "alice", "phone", 3)
			bob := startDev(t, srv, "bob", "phone", 3)
			carol := startDev(t, srv, "carol", "phone", 3)
			dave := startDev(t, srv, "dave", "phone", 3)
			g, err := alice.c.CreateGroupE2E(ctx, "tiers", []string{"bob", "carol", "dave"})
			if err != nil {
				t.Fatal(err)
			}
			if g.Tier != tc.name {
				t.Fatalf("tier %q, want %q", g.Tier, tc.name)
			}
			members := []string{"alice", "bob", "carol", "dave"}
			var last uint64
			for i := 0; i < 3; i++ {
				ack, err := alice.m.SendGroup(ctx, g.ConvID, members, fmt.Sprint("tier message ", i))
				if err != nil {
					t.Fatal(err)
				}
				last = ack.Seq
			}
			// Pushes (and the reconnect sync) reach every member; each opens them.
			for name, d := range map[string]*dev{"bob": bob, "carol": carol, "dave": dave} {
				deadline := time.Now().Add(30 * time.Second)
				for {
					var texts []string
					for _, m := range d.events(g.ConvID) {
						o, err := d.m.Open(m)
						if err != nil {
							t.Fatalf("%s: open pushed %d: %v", name, m.Seq, err)
						}
						if !o.Control && o.Kind == protocol.KindText {
							texts = append(texts, o.Text)
						}
					}
					if len(texts) == 3 {
						if texts[2] != "tier message 2" {
							t.Fatalf("%s read %q", name, texts)
						}
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s got %q from the event stream", name, texts)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			// Receipts and the conversation list work on E2E groups too.
			if err := bob.c.MarkRead(ctx, g.ConvID, last); err != nil {
				t.Fatal(err)
			}
			list, err := bob.c.Conversations(ctx)
			if err != nil || len(list) != 1 || list[0].Unread != 0 || !list[0].E2E {
				t.Fatalf("bob's list %+v %v", list, err)
			}
		})
	}
}
