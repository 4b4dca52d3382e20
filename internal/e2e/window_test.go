package e2e

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestFormerMemberSeesNothingWrittenAfterLeaving: a member removed (bob)
// or who left (dave) at leave_seq sees no content written after it. A
// message edited after leave_seq comes back with the body (and edited
// flag) it had at leave_seq; one edited before and after, with the body of
// the last edit before; a message recalled after leave_seq is hidden
// (recalled, no body: a recall is a deletion). The later events themselves
// are never returned. Checked on every read path a former member has:
// WebSocket history and sync, HTTP /v1/rpc history and sync, and GET
// /v1/conversations/snapshot; a current member (carol) sees the new bodies.
func TestFormerMemberSeesNothingWrittenAfterLeaving(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "phone")
	conv := alice.createGroup("window", "bob", "carol", "dave")
	seq := func(f *protocol.Frame) uint64 { return mustOK(t, f, protocol.TypeAck).Seq }
	edit := func(cmid string, target uint64, body string) uint64 {
		return seq(alice.call(protocol.Frame{Type: protocol.TypeEdit, ConvID: conv, ClientMsgID: cmid, TargetSeq: target, Body: body}))
	}
	plain := seq(alice.sendText(conv, "m1", "plain"))
	later := seq(alice.sendText(conv, "m2", "as sent"))
	twice := seq(alice.sendText(conv, "m3", "first"))
	gone := seq(alice.sendText(conv, "m4", "to be recalled"))
	edit("e1", twice, "second") // before the leaves

	dave := dialRaw(t, srv, "dave", "phone")
	mustOK(t, dave.call(protocol.Frame{Type: protocol.TypeLeave, ConvID: conv}), protocol.TypeConv)
	mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: conv, Members: []string{"bob"}}), protocol.TypeConv)

	after := []uint64{
		edit("e2", later, "edited after"),
		edit("e3", twice, "third"),
		edit("e4", twice, "fourth"),
		seq(alice.call(protocol.Frame{Type: protocol.TypeRecall, ConvID: conv, ClientMsgID: "r1", TargetSeq: gone})),
		seq(alice.sendText(conv, "m5", "new")),
	}

	type view struct {
		body             string
		edited, recalled bool
	}
	before := map[uint64]view{
		plain: {"plain", false, false},
		later: {"as sent", false, false},
		twice: {"second", true, false},
		gone:  {"", false, true},
	}
	now := map[uint64]view{
		plain: {"plain", false, false},
		later: {"edited after", true, false},
		twice: {"fourth", true, false},
		gone:  {"", false, true},
	}
	check := func(t *testing.T, path string, msgs []protocol.Message, leave uint64, want map[uint64]view) {
		t.Helper()
		seen := 0
		for _, m := range msgs {
			if leave != 0 && m.Seq > leave {
				t.Errorf("%s: seq %d (%s) is after leave_seq %d", path, m.Seq, m.Kind, leave)
			}
			w, ok := want[m.Seq]
			if !ok {
				continue
			}
			seen++
			if m.Body != w.body || m.Edited != w.edited || m.Recalled != w.recalled {
				t.Errorf("%s: seq %d = %q edited %v recalled %v, want %q edited %v recalled %v",
					path, m.Seq, m.Body, m.Edited, m.Recalled, w.body, w.edited, w.recalled)
			}
		}
		if seen != len(want) {
			t.Errorf("%s: %d of the %d messages returned (%d in all)", path, seen, len(want), len(msgs))
		}
	}

	for _, who := range []string{"bob", "dave", "carol"} {
		t.Run(who, func(t *testing.T) {
			c := dialRaw(t, srv, who, "tablet")
			list := mustOK(t, c.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List
			if len(list) != 1 {
				t.Fatalf("conv_list = %+v", list)
			}
			leave, want := list[0].LeaveSeq, before
			if who == "carol" {
				want = now
				if leave != 0 {
					t.Fatalf("carol's leave_seq = %d", leave)
				}
			} else if leave == 0 || leave >= after[0] {
				t.Fatalf("%s's leave_seq = %d, want it before the later edits (%v)", who, leave, after)
			}

			check(t, "ws history", c.history(conv), leave, want)
			back := mustOK(t, c.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, Limit: 200}), protocol.TypeHistory)
			check(t, "ws history before_seq", back.Messages, leave, want)
			snap := mustOK(t, c.call(protocol.Frame{Type: protocol.TypeSync, Convs: []protocol.SyncConv{{ConvID: conv}}}), protocol.TypeSnapshot).Snapshot
			if len(snap) != 1 {
				t.Fatalf("ws sync = %+v", snap)
			}
			check(t, "ws sync", snap[0].Messages, leave, want)

			p := &pollClient{t: t, base: srv.HTTPURL, token: srv.Token(who), device: "web"}
			zero := uint64(0)
			h := p.rpc(protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, AfterSeq: &zero, Limit: 200})
			check(t, "rpc history", mustOK(t, h, protocol.TypeHistory).Messages, leave, want)
			s := p.rpc(protocol.Frame{Type: protocol.TypeSync, Convs: []protocol.SyncConv{{ConvID: conv}}})
			if s = mustOK(t, s, protocol.TypeSnapshot); len(s.Snapshot) != 1 {
				t.Fatalf("rpc sync = %+v", s.Snapshot)
			}
			check(t, "rpc sync", s.Snapshot[0].Messages, leave, want)
			status, raw := p.do("GET", "/v1/conversations/snapshot?conv_ids="+u64(conv)+"&from_seq=0&device=web", nil)
			var out struct {
				Snapshot []protocol.ConvSnapshot `json:"snapshot"`
			}
			if status != http.StatusOK || json.Unmarshal(raw, &out) != nil || len(out.Snapshot) != 1 {
				t.Fatalf("http snapshot: %d %s", status, raw)
			}
			check(t, "http snapshot", out.Snapshot[0].Messages, leave, want)
		})
	}
}
