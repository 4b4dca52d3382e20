package e2e

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// reactFrame is a react request.
func reactFrame(conv, target uint64, cmid, emoji string, remove bool) protocol.Frame {
	return protocol.Frame{Type: protocol.TypeReact, ConvID: conv, ClientMsgID: cmid, TargetSeq: target, Emoji: emoji, Remove: remove}
}

// reactionPushes reads c's frames in order until the msg push of conv's
// seq upto, and returns the reaction events pushed on their own (msg of
// kind react/unreact) and the reactions pushes of conv before it.
func reactionPushes(t *testing.T, c *rawConn, conv, upto uint64) (events []protocol.Message, runs []*protocol.Frame) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		var f *protocol.Frame
		if len(c.held) > 0 {
			// Frames that came in while a call waited for its answer.
			f, c.held = c.held[0], c.held[1:]
		} else {
			select {
			case g, ok := <-c.in:
				if !ok {
					t.Fatalf("%s: connection closed waiting for seq %d", c.hello.UserID, upto)
				}
				f = g
			case <-deadline:
				t.Fatalf("%s: no push of conv %d seq %d within 10s", c.hello.UserID, conv, upto)
			}
		}
		{
			switch {
			case f.Type == protocol.TypeReactions && f.ConvID == conv:
				runs = append(runs, f)
			case f.Type == protocol.TypeMsg && f.Message.ConvID == conv:
				if f.Message.Seq == upto {
					return events, runs
				}
				if chat.IsReaction(f.Message.Kind) {
					events = append(events, *f.Message)
				}
			}
		}
	}
}

// TestReactions: a react frame takes a seq; in a direct conversation and
// a small group each reaction is pushed on its own with its target's
// counts, in a medium and a large group reactions are coalesced into
// reactions pushes (fewer than the reactions) that cover the seqs in
// order before the next message; history and sync carry the counts with
// me, reaction events as stubs (the last of each target with the counts,
// the others superseded); unknown emoji, a target beyond the
// conversation, an event, one before the reactor's join_seq, a recalled
// message, a reaction already there or not there, and one past
// chat.reactions_per_user are refused with their codes; an E2E
// conversation answers e2e_unsupported.
func TestReactions(t *testing.T) {
	srv := servertest.Start(t, servertest.WithChat(func(c *chat.Config) {
		c.SmallBelow, c.LargeAbove, c.Hysteresis = 4, 6, 0.1
		c.ReactionsPerUser = 2
	}))
	alice := dialRaw(t, srv, "alice", "phone")
	bob := dialRaw(t, srv, "bob", "phone")
	c1 := dialRaw(t, srv, "c1", "phone")
	convs := []struct {
		name      string
		id        uint64
		coalesced bool
	}{
		{"direct", alice.openDirect("bob"), false},
		{"small", alice.createGroup("small", "bob", "c1"), false},
		{"medium", alice.createGroup("medium", "bob", "c1", "c2"), true},
		{"large", alice.createGroup("large", append([]string{"bob", "c1"}, users("u", 0, 5)...)...), true},
	}
	for i, cv := range convs {
		t.Run(cv.name, func(t *testing.T) {
			cm := func(s string) string { return fmt.Sprintf("%s-%d", s, i) }
			target := mustOK(t, alice.sendText(cv.id, cm("t"), "react to me"), protocol.TypeAck).Seq
			pushIn(t, alice, cv.id, target)
			reactors := []*rawConn{bob, alice}
			if cv.name != "direct" {
				reactors = append(reactors, c1)
			}
			var last uint64
			for j, r := range reactors {
				last = mustOK(t, r.call(reactFrame(cv.id, target, cm(fmt.Sprint("r", j)), "👍", false)), protocol.TypeAck).Seq
			}
			// bob adds a second one and takes it back.
			mustOK(t, bob.call(reactFrame(cv.id, target, cm("heart"), "❤️", false)), protocol.TypeAck)
			last = mustOK(t, bob.call(reactFrame(cv.id, target, cm("unheart"), "❤️", true)), protocol.TypeAck).Seq
			events := int(last - target)
			// The next message pushes what is held first.
			next := mustOK(t, alice.sendText(cv.id, cm("after"), "after the reactions"), protocol.TypeAck).Seq
			want := []protocol.Reaction{{Emoji: "👍", Count: len(reactors)}}
			evs, runs := reactionPushes(t, alice, cv.id, next)
			if !cv.coalesced {
				if len(evs) != events || len(runs) != 0 {
					t.Fatalf("pushes: %d events and %d reactions pushes, want %d events on their own", len(evs), len(runs), events)
				}
				lastEv := evs[len(evs)-1]
				if lastEv.Kind != protocol.KindUnreact || lastEv.Body != "❤️" || lastEv.Sender != "bob" || lastEv.TargetSeq != target || !reflect.DeepEqual(lastEv.Reactions, want) {
					t.Fatalf("last event pushed = %+v, want bob's unreact ❤️ on %d with counts %v", lastEv, target, want)
				}
			} else {
				if len(evs) != 0 || len(runs) == 0 || len(runs) >= events {
					t.Fatalf("pushes: %d events and %d reactions pushes for %d reactions, want only fewer reactions pushes", len(evs), len(runs), events)
				}
				// The runs cover target+1..next-1 in order, without a hole.
				at := target
				for _, r := range runs {
					if r.FromSeq != at+1 || r.Seq < r.FromSeq {
						t.Fatalf("reactions push %d..%d after seq %d: a hole or an overlap", r.FromSeq, r.Seq, at)
					}
					at = r.Seq
				}
				end := runs[len(runs)-1]
				if at != next-1 || len(end.Reacted) != 1 || end.Reacted[0].Seq != target || !reflect.DeepEqual(end.Reacted[0].Reactions, want) {
					t.Fatalf("last reactions push = %d..%d %+v, want up to %d with %d: %v", end.FromSeq, end.Seq, end.Reacted, next-1, target, want)
				}
				if wantAck := map[string]string{"medium": protocol.AckBatch, "large": protocol.AckNone}[cv.name]; end.Ack != wantAck {
					t.Fatalf("reactions push ack = %q, want %q", end.Ack, wantAck)
				}
			}

			// Reads: counts with me; events as stubs.
			zero := uint64(0)
			for _, who := range []*rawConn{alice, bob} {
				h := mustOK(t, who.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: cv.id, AfterSeq: &zero, Limit: 100}), protocol.TypeHistory)
				var msg *protocol.Message
				var stubs []protocol.Message
				for k := range h.Messages {
					m := h.Messages[k]
					switch {
					case m.Seq == target:
						msg = &h.Messages[k]
					case chat.IsReaction(m.Kind):
						stubs = append(stubs, m)
					}
				}
				wantMe := []protocol.Reaction{{Emoji: "👍", Count: len(reactors), Me: true}}
				if msg == nil || !reflect.DeepEqual(msg.Reactions, wantMe) {
					t.Fatalf("%s: history's message %d = %+v, want reactions %v", who.hello.UserID, target, msg, wantMe)
				}
				if len(stubs) != events {
					t.Fatalf("%s: history has %d reaction events, want %d", who.hello.UserID, len(stubs), events)
				}
				for k, s := range stubs {
					lastOne := k == len(stubs)-1
					if s.Body != "" || s.TargetSeq != target || s.Superseded == lastOne || (lastOne && !reflect.DeepEqual(s.Reactions, wantMe)) || (!lastOne && s.Reactions != nil) {
						t.Fatalf("%s: history's reaction event %d = %+v, want a stub (the last with %v)", who.hello.UserID, s.Seq, s, wantMe)
					}
				}
				// A sync from after the target: the target is outside
				// the page, its last event carries its counts.
				snap := mustOK(t, who.call(protocol.Frame{Type: protocol.TypeSync, Convs: []protocol.SyncConv{{ConvID: cv.id, AfterSeq: target}}}), protocol.TypeSnapshot).Snapshot
				if len(snap) != 1 {
					t.Fatalf("%s: sync = %d conversations", who.hello.UserID, len(snap))
				}
				var carried *protocol.Message
				for k, m := range snap[0].Messages {
					if chat.IsReaction(m.Kind) && !m.Superseded {
						if carried != nil {
							t.Fatalf("%s: sync has two reaction events with counts for one target", who.hello.UserID)
						}
						carried = &snap[0].Messages[k]
					}
				}
				if carried == nil || !reflect.DeepEqual(carried.Reactions, wantMe) {
					t.Fatalf("%s: sync's last reaction event = %+v, want counts %v", who.hello.UserID, carried, wantMe)
				}
			}

			refuse := func(what string, c *rawConn, f protocol.Frame, code protocol.Code) {
				t.Helper()
				if r := c.call(f); r.Type != protocol.TypeError || r.Code != code {
					t.Fatalf("%s answered %s %s %s, want %s", what, r.Type, r.Code, r.Error, code)
				}
			}
			refuse("an emoji not in chat.reactions", bob, reactFrame(cv.id, target, cm("x1"), "🦄", false), protocol.CodeInvalidArgument)
			refuse("a target beyond the conversation", bob, reactFrame(cv.id, next+100, cm("x2"), "😂", false), protocol.CodeBadReference)
			refuse("a reaction to an event", bob, reactFrame(cv.id, last, cm("x3"), "😂", false), protocol.CodeBadReference)
			refuse("the same reaction twice", bob, reactFrame(cv.id, target, cm("x4"), "👍", false), protocol.CodeConflict)
			refuse("removing a reaction not there", bob, reactFrame(cv.id, target, cm("x5"), "😂", true), protocol.CodeConflict)
			second := mustOK(t, bob.call(reactFrame(cv.id, target, cm("second"), "😂", false)), protocol.TypeAck).Seq
			if cv.coalesced {
				// No message follows: the run leaves on its timer.
				f := alice.nextTimeout(protocol.TypeReactions, 5*time.Second)
				want := []protocol.Reaction{{Emoji: "👍", Count: len(reactors)}, {Emoji: "😂", Count: 1}}
				if f == nil || f.FromSeq != next+1 || f.Seq != second || len(f.Reacted) != 1 || !reflect.DeepEqual(f.Reacted[0].Reactions, want) {
					t.Fatalf("reactions push on the timer = %+v, want %d..%d with %v", f, next+1, second, want)
				}
			}
			refuse("a third emoji (reactions_per_user 2)", bob, reactFrame(cv.id, target, cm("x6"), "🎉", false), protocol.CodeTooLarge)
			if cv.name != "direct" {
				alice.addMembers(cv.id, "dave")
				dave := dialRaw(t, srv, "dave", "phone")
				refuse("a target before the reactor's join_seq", dave, reactFrame(cv.id, target, cm("x7"), "👍", false), protocol.CodeBadReference)
			}
			// A recall clears the counts and refuses reactions.
			mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeRecall, ConvID: cv.id, ClientMsgID: cm("recall"), TargetSeq: target}), protocol.TypeAck)
			refuse("a reaction to a recalled message", alice, reactFrame(cv.id, target, cm("x8"), "😂", false), protocol.CodeConflict)
			h := mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: cv.id, AfterSeq: &zero, Limit: 100}), protocol.TypeHistory)
			for _, m := range h.Messages {
				if m.Seq == target && (!m.Recalled || m.Reactions != nil) {
					t.Fatalf("recalled message in history = %+v, want recalled without reactions", m)
				}
			}
		})
	}
	t.Run("e2e", func(t *testing.T) {
		conv := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "secret", Members: []string{"bob"}, E2E: true}), protocol.TypeConv).Conv.ConvID
		seq := mustOK(t, alice.sendText(conv, "e2e-1", e2eBody("hi")), protocol.TypeAck).Seq
		if r := bob.call(reactFrame(conv, seq, "e2e-r", "👍", false)); r.Code != protocol.CodeE2EUnsupported {
			t.Fatalf("react in an E2E group answered %s %s, want e2e_unsupported", r.Type, r.Code)
		}
	})
}
