package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestLargeWebSocketAnswersArePaged: a reading WebSocket client asking for
// history with limit 200, or syncing 200 new messages, in a conversation
// of 16 KiB messages (3.3 MB, over the 1 MiB outbound bound) gets an
// answer within the bound that announces what it left out (has_more,
// more_unread), stays connected, and pages every message — it is not
// dropped and dropped again at each reconnect.
func TestLargeWebSocketAnswersArePaged(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "d")
	conv := alice.openDirect("bob")
	body := strings.Repeat("x", protocol.DefaultLimits.MaxBodyBytes)
	const n = 200
	for i := 0; i < n; i++ {
		mustOK(t, alice.sendText(conv, fmt.Sprint("big", i), body), protocol.TypeAck)
	}
	limit := srv.Gateway().MaxHTTPAnswer()
	bob := dialRaw(t, srv, "bob", "phone")

	h := bob.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, Limit: 200})
	if h.Type != protocol.TypeHistory {
		t.Fatalf("history: %s %s", h.Type, h.Error)
	}
	if size := len(mustJSON(t, h)); size > limit+4096 || len(h.Messages) == 0 || !h.HasMore || h.Messages[len(h.Messages)-1].Seq != n {
		t.Fatalf("history: %d bytes, %d messages ending at %d, has_more %v; want ≤ %d bytes, the newest, has_more", size, len(h.Messages), h.Messages[len(h.Messages)-1].Seq, h.HasMore, limit)
	}
	got := len(h.Messages)
	before := h.Messages[0].Seq
	for before > 1 {
		p := bob.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, BeforeSeq: before, Limit: 200})
		if p.Type != protocol.TypeHistory || len(p.Messages) == 0 {
			t.Fatalf("history before %d: %s %s", before, p.Type, p.Error)
		}
		got += len(p.Messages)
		before = p.Messages[0].Seq
	}
	if got != n {
		t.Fatalf("paged %d messages, want %d", got, n)
	}

	s := bob.call(protocol.Frame{Type: protocol.TypeSync, Convs: []protocol.SyncConv{{ConvID: conv, AfterSeq: 0}}})
	if s.Type != protocol.TypeSnapshot || len(s.Snapshot) != 1 {
		t.Fatalf("sync: %s %s", s.Type, s.Error)
	}
	if c := s.Snapshot[0]; len(mustJSON(t, s)) > limit+4096 || len(c.Messages) == 0 || c.MoreUnread == 0 || uint64(len(c.Messages))+c.MoreUnread != n {
		t.Fatalf("sync: %d messages + more_unread %d, want %d in all with some left out, within %d bytes", len(c.Messages), c.MoreUnread, n, limit)
	}
	// Still connected: the answers did not overflow the outbound bound.
	if p := bob.call(protocol.Frame{Type: protocol.TypePing}); p.Type != protocol.TypePong {
		t.Fatalf("ping after the large answers: %s", p.Type)
	}
}

func mustJSON(t *testing.T, f *protocol.Frame) []byte {
	t.Helper()
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
