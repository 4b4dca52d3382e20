package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestLargeHTTPAnswersArePaged: 70 messages of 16 KiB (over the 1 MiB
// write bound) come back whole over the HTTP fallback: the snapshot, rpc
// sync and rpc history answer complete JSON within the bound, announce
// what they left out (more_unread, has_more), and paging with history
// brings every message.
func TestLargeHTTPAnswersArePaged(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "d")
	conv := alice.openDirect("bob")
	body := strings.Repeat("x", protocol.DefaultLimits.MaxBodyBytes)
	const n = 70
	for i := 0; i < n; i++ {
		mustOK(t, alice.sendText(conv, fmt.Sprint("big", i), body), protocol.TypeAck)
	}
	bob := &pollClient{t: t, base: srv.HTTPURL, token: srv.Token("bob"), device: "web"}
	limit := srv.Gateway().MaxHTTPAnswer()

	t.Run("snapshot", func(t *testing.T) {
		status, raw := bob.do("GET", "/v1/conversations/snapshot?conv_ids="+u64(conv)+"&from_seq=0&device=web", nil)
		var out struct {
			Snapshot []protocol.ConvSnapshot `json:"snapshot"`
		}
		if status != http.StatusOK || json.Unmarshal(raw, &out) != nil || len(out.Snapshot) != 1 {
			t.Fatalf("snapshot: %d, %d bytes", status, len(raw))
		}
		s := out.Snapshot[0]
		if len(raw) > limit+4096 || len(s.Messages) == 0 || uint64(len(s.Messages))+s.MoreUnread != n {
			t.Fatalf("%d bytes, %d messages + more_unread %d; want ≤ %d bytes and %d in all", len(raw), len(s.Messages), s.MoreUnread, limit, n)
		}
		// Page the older ones with history before_seq.
		got := len(s.Messages)
		before := s.Messages[0].Seq
		for before > 1 {
			h := bob.rpc(protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, BeforeSeq: before, Limit: 200})
			if h.Type != protocol.TypeHistory || len(h.Messages) == 0 {
				t.Fatalf("history before %d: %s %s", before, h.Type, h.Error)
			}
			got += len(h.Messages)
			before = h.Messages[0].Seq
		}
		if got != n {
			t.Fatalf("paged %d messages, want %d", got, n)
		}
	})
	t.Run("rpc history forward", func(t *testing.T) {
		var after uint64
		got := 0
		for {
			h := bob.rpc(protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, AfterSeq: &after, Limit: 200})
			if h.Type != protocol.TypeHistory {
				t.Fatalf("history after %d: %s %s", after, h.Type, h.Error)
			}
			for _, m := range h.Messages {
				if m.Seq != after+1 {
					t.Fatalf("seq %d after %d: a hole", m.Seq, after)
				}
				after = m.Seq
				got++
			}
			if !h.HasMore {
				break
			}
		}
		if got != n {
			t.Fatalf("got %d messages, want %d", got, n)
		}
	})
	t.Run("rpc sync", func(t *testing.T) {
		r := bob.rpc(protocol.Frame{Type: protocol.TypeSync, All: true})
		if r.Type != protocol.TypeSnapshot || len(r.Snapshot) != 1 {
			t.Fatalf("sync: %s %s", r.Type, r.Error)
		}
		if s := r.Snapshot[0]; uint64(len(s.Messages))+s.MoreUnread != n || s.MoreUnread == 0 {
			t.Fatalf("sync: %d messages + more_unread %d, want %d with some left out", len(s.Messages), s.MoreUnread, n)
		}
	})
}
