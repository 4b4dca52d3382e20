package e2e

import (
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// e2eBody is an E2E envelope (the server checks its form, never its
// content), distinct per text.
func e2eBody(text string) string {
	return fmt.Sprintf(`{"e2e":1,"to":[{"user":"bob","device":"phone","type":2,"body":"%s"}]}`, base64.StdEncoding.EncodeToString([]byte(text)))
}

// pushIn waits for the push of conv's seq to c, skipping other pushes.
func pushIn(t *testing.T, c *rawConn, conv, seq uint64) protocol.Message {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		f := c.nextTimeout(protocol.TypeMsg, time.Until(deadline))
		if f == nil {
			break
		}
		if f.Message.ConvID == conv && f.Message.Seq == seq {
			return *f.Message
		}
	}
	t.Fatalf("%s: no push of conv %d seq %d", c.hello.UserID, conv, seq)
	return protocol.Message{}
}

// TestReplies: a send's reply_to is stored, pushed, kept through an edit
// of the reply and shown as reply_recalled on history and sync once its
// target is recalled, in a direct conversation, in each fan-out tier and
// in an E2E group; a reply_to beyond the last seq, before the sender's
// join_seq or naming an event answers bad_reference, a recalled target
// conflict, and reply_to on an edit or a state message invalid_argument.
func TestReplies(t *testing.T) {
	srv := servertest.Start(t, servertest.WithChat(func(c *chat.Config) { c.SmallBelow, c.LargeAbove, c.Hysteresis = 4, 6, 0.1 }))
	alice := dialRaw(t, srv, "alice", "phone")
	bob := dialRaw(t, srv, "bob", "phone")
	e2eGroup := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "secret", Members: []string{"bob"}, E2E: true}), protocol.TypeConv).Conv.ConvID
	convs := []struct {
		name string
		id   uint64
		e2e  bool
		tier string
	}{
		{"direct", alice.openDirect("bob"), false, ""},
		{"small", alice.createGroup("small", "bob"), false, "small"},
		{"medium", alice.createGroup("medium", "bob", "c1", "c2"), false, "medium"},
		{"large", alice.createGroup("large", append([]string{"bob"}, users("u", 0, 5)...)...), false, "large"},
		{"e2e group", e2eGroup, true, "small"},
	}
	for i, cv := range convs {
		t.Run(cv.name, func(t *testing.T) {
			body := func(s string) string {
				if cv.e2e {
					return e2eBody(s)
				}
				return s
			}
			id := func(s string) string { return fmt.Sprintf("%d-%s", i, s) }
			target := mustOK(t, alice.sendText(cv.id, id("t"), body("question")), protocol.TypeAck).Seq
			reply := mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeSend, ConvID: cv.id, ClientMsgID: id("r"), Body: body("answer"), ReplyTo: target}), protocol.TypeAck).Seq
			if p := pushIn(t, alice, cv.id, reply); p.ReplyTo != target || p.ReplyRecalled {
				t.Fatalf("pushed reply = %+v, want reply_to %d", p, target)
			}
			// The reference survives an edit of the reply.
			edit := mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeEdit, ConvID: cv.id, ClientMsgID: id("e"), TargetSeq: reply, Body: body("better answer")}), protocol.TypeAck).Seq
			// Refusals, none of which takes a seq.
			refuse := func(what string, f protocol.Frame, code protocol.Code) {
				t.Helper()
				f.ConvID, f.ClientMsgID = cv.id, id(what)
				if f.Type == "" {
					f.Type = protocol.TypeSend
				}
				if f.Body == "" {
					f.Body = body(what)
				}
				if r := bob.call(f); r.Type != protocol.TypeError || r.Code != code {
					t.Fatalf("%s answered %s %s (%s), want %s", what, r.Type, r.Code, r.Error, code)
				}
			}
			refuse("beyond", protocol.Frame{ReplyTo: edit + 5}, protocol.CodeBadReference)
			refuse("event", protocol.Frame{ReplyTo: edit}, protocol.CodeBadReference)
			refuse("on edit", protocol.Frame{Type: protocol.TypeEdit, TargetSeq: reply, ReplyTo: target}, protocol.CodeInvalidArgument)
			if !cv.e2e {
				refuse("state", protocol.Frame{Kind: protocol.KindState, CoalesceKey: "k", ReplyTo: target}, protocol.CodeInvalidArgument)
			}
			recall := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeRecall, ConvID: cv.id, ClientMsgID: id("x"), TargetSeq: target}), protocol.TypeAck).Seq
			refuse("recalled", protocol.Frame{ReplyTo: target}, protocol.CodeConflict)
			if cv.tier != "" {
				info := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeConvInfo, ConvID: cv.id}), protocol.TypeConv).Conv
				if info.Tier != cv.tier {
					t.Fatalf("tier %q, want %q", info.Tier, cv.tier)
				}
			}
			check := func(what string, msgs []protocol.Message) {
				t.Helper()
				var got *protocol.Message
				for j := range msgs {
					if msgs[j].Seq == reply {
						got = &msgs[j]
					}
				}
				if got == nil || got.ReplyTo != target || !got.ReplyRecalled || !got.Edited {
					t.Fatalf("%s: reply = %+v, want edited, reply_to %d, reply_recalled", what, got, target)
				}
			}
			// A page holding the target, and one without it (the target is read).
			zero := uint64(0)
			check("history", mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: cv.id, AfterSeq: &zero}), protocol.TypeHistory).Messages)
			check("history without the target", mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: cv.id, BeforeSeq: recall + 1, Limit: int(recall - reply + 1)}), protocol.TypeHistory).Messages)
			snap := mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeSync, Convs: []protocol.SyncConv{{ConvID: cv.id, AfterSeq: target}}}), protocol.TypeSnapshot).Snapshot
			if len(snap) != 1 {
				t.Fatalf("sync = %+v, want conv %d", snap, cv.id)
			}
			check("sync", snap[0].Messages)
			if cv.tier == "" {
				return
			}
			// A member who joins later cannot reply to what came before.
			join := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeAddMembers, ConvID: cv.id, Members: []string{"dave"}}), protocol.TypeConv).Conv.LastSeq
			dave := dialRaw(t, srv, "dave", "phone")
			defer dave.ws.Close()
			if r := dave.call(protocol.Frame{Type: protocol.TypeSend, ConvID: cv.id, ClientMsgID: id("d"), Body: body("late"), ReplyTo: reply}); r.Code != protocol.CodeBadReference {
				t.Fatalf("reply before join_seq %d answered %s %s, want bad_reference", join, r.Type, r.Code)
			}
			if cv.e2e {
				return
			}
			// A system event is no message to answer; what follows the join is.
			if r := dave.call(protocol.Frame{Type: protocol.TypeSend, ConvID: cv.id, ClientMsgID: id("d1"), Body: "to the join", ReplyTo: join}); r.Code != protocol.CodeBadReference {
				t.Fatalf("reply to the member_added event answered %s %s, want bad_reference", r.Type, r.Code)
			}
			welcome := mustOK(t, alice.sendText(cv.id, id("w"), "welcome"), protocol.TypeAck).Seq
			if got := mustOK(t, dave.call(protocol.Frame{Type: protocol.TypeSend, ConvID: cv.id, ClientMsgID: id("d2"), Body: "thanks", ReplyTo: welcome}), protocol.TypeAck).Seq; pushIn(t, alice, cv.id, got).ReplyTo != welcome {
				t.Fatalf("dave's reply to %d lost its reference", welcome)
			}
		})
	}
}
