package e2eechat

import (
	"context"
	"testing"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// BenchmarkOpenDirect measures Open of direct messages on a device whose
// store is files (the CLI's, each write synced): decryption, the label
// checks and the records they keep. Sending is outside the timer.
func BenchmarkOpenDirect(b *testing.B) {
	srv := servertest.Start(b)
	ctx := context.Background()
	open := func(user string, st e2ee.Store) *Messenger {
		c, err := client.New(client.Config{URL: srv.URL, Token: srv.Token(user), Device: "phone"})
		if err != nil {
			b.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		go func() { _ = c.Run(cctx) }()
		go func() {
			for range c.Events() {
			}
		}()
		b.Cleanup(func() { cancel(); c.Close() })
		d, err := e2ee.OpenDevice(st, e2ee.Address{User: user, Device: "phone"})
		if err != nil {
			b.Fatal(err)
		}
		m := New(c, d, st)
		if _, err := m.PublishKeys(ctx, 5); err != nil {
			b.Fatal(err)
		}
		return m
	}
	alice := open("alice", e2ee.NewMemoryStore())
	fs, err := e2ee.OpenFileStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	bob := open("bob", fs)
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		b.Fatal(err)
	}
	var msgs []protocol.Message
	for len(msgs) < b.N {
		n := min(b.N-len(msgs), 200)
		var after uint64
		if len(msgs) > 0 {
			after = msgs[len(msgs)-1].Seq
		}
		for range n {
			if _, err := alice.SendDirect(ctx, conv.ConvID, "bob", "a message of some forty bytes, about so"); err != nil {
				b.Fatal(err)
			}
		}
		got, _, err := bob.c.History(ctx, conv.ConvID, client.HistoryQuery{Forward: true, AfterSeq: after, Limit: n})
		if err != nil || len(got) < n {
			b.Fatalf("history: %d %v", len(got), err)
		}
		msgs = append(msgs, got...)
	}
	b.ResetTimer()
	for _, msg := range msgs {
		if _, err := bob.Open(msg); err != nil {
			b.Fatal(err)
		}
	}
}
