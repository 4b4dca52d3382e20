package client

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// Tests of the requests that cover the rest of the protocol's client
// frames (groups.go, presence.go) against a real in-process node.

// wantCode fails unless err is a *Error with code.
func wantCode(t *testing.T, what string, err error, code protocol.Code) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != code || CodeOf(err) != code {
		t.Fatalf("%s: err %v, want code %s", what, err, code)
	}
}

// systemEvents returns the system events rc has received in conv.
func systemEvents(t *testing.T, rc *runningClient, conv uint64) []protocol.SystemEvent {
	t.Helper()
	var out []protocol.SystemEvent
	for _, m := range rc.rec.messages(conv) {
		if m.Kind != protocol.KindSystem {
			continue
		}
		ev, err := ParseSystemEvent(&m)
		if err != nil {
			t.Fatalf("system message %d: %v", m.Seq, err)
		}
		out = append(out, ev)
	}
	return out
}

func hasEvent(evs []protocol.SystemEvent, event, actor, user, role string) bool {
	for _, ev := range evs {
		if ev.Event == event && ev.Actor == actor && len(ev.Users) > 0 && ev.Users[0] == user && ev.Role == role {
			return true
		}
	}
	return false
}

// TestE2EGroupAdministration: remove, roles, mute, leave and ownership
// transfer through the SDK, each answered with the group after the change
// and seen by members as a system event; refusals carry the documented
// codes.
func TestE2EGroupAdministration(t *testing.T) {
	srv := servertest.Start(t)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	carol := startE2E(t, srv.URL, srv.Token("carol"), "phone", nil)
	ctx := ctxT(t)
	g, err := alice.CreateGroup(ctx, "team", []string{"bob", "carol", "dave"})
	if err != nil || g.Role != protocol.RoleOwner || g.MemberCount != 4 {
		t.Fatalf("CreateGroup = %+v, %v", g, err)
	}
	conv := g.ConvID

	// Roles: only the owner sets them; an unknown role is refused locally.
	if _, err := bob.SetRole(ctx, conv, "carol", protocol.RoleAdmin); err == nil {
		t.Fatal("a plain member set a role")
	} else {
		wantCode(t, "member SetRole", err, protocol.CodeForbidden)
	}
	_, err = alice.SetRole(ctx, conv, "bob", "boss")
	wantCode(t, "SetRole boss", err, protocol.CodeInvalidArgument)
	_, err = alice.SetRole(ctx, conv, "zed", protocol.RoleAdmin)
	wantCode(t, "SetRole of a non-member", err, protocol.CodeNotFound)
	if _, err := alice.SetRole(ctx, conv, "bob", protocol.RoleAdmin); err != nil {
		t.Fatalf("SetRole admin: %v", err)
	}
	if info, err := bob.ConvInfo(ctx, conv); err != nil || info.Role != protocol.RoleAdmin {
		t.Fatalf("bob's role after SetRole = %+v, %v", info, err)
	}

	// Mute: an admin mutes a plain member, whose sends are then refused.
	if _, err := bob.Mute(ctx, conv, "carol", true); err != nil {
		t.Fatalf("Mute: %v", err)
	}
	_, err = carol.Send(ctx, conv, "let me speak")
	wantCode(t, "muted Send", err, protocol.CodeForbidden)
	_, err = carol.Mute(ctx, conv, "bob", true)
	wantCode(t, "member mutes an admin", err, protocol.CodeForbidden)
	if _, err := bob.Mute(ctx, conv, "carol", false); err != nil {
		t.Fatalf("unmute: %v", err)
	}
	if _, err := carol.Send(ctx, conv, "thanks"); err != nil {
		t.Fatalf("Send after unmute: %v", err)
	}

	// Remove: an admin removes a plain member; a second removal is not_found.
	info, err := bob.RemoveMembers(ctx, conv, []string{"dave"})
	if err != nil || info.MemberCount != 3 {
		t.Fatalf("RemoveMembers = %+v, %v", info, err)
	}
	_, err = bob.RemoveMembers(ctx, conv, []string{"dave"})
	wantCode(t, "remove a former member", err, protocol.CodeNotFound)

	// Leave: the owner cannot leave while others remain; it hands over.
	_, err = alice.Leave(ctx, conv)
	wantCode(t, "owner Leave", err, protocol.CodeForbidden)
	if info, err := alice.SetRole(ctx, conv, "bob", protocol.RoleOwner); err != nil || info.Role != protocol.RoleAdmin {
		t.Fatalf("ownership transfer = %+v, %v (alice should be admin now)", info, err)
	}
	if info, err := alice.Leave(ctx, conv); err != nil || info.MemberCount != 2 {
		t.Fatalf("Leave = %+v, %v", info, err)
	}
	_, err = alice.Leave(ctx, conv)
	wantCode(t, "second Leave", err, protocol.CodeNotMember)
	_, err = alice.Send(ctx, conv, "still here?")
	wantCode(t, "Send after Leave", err, protocol.CodeNotMember)

	// Members see every change as a system event, in order.
	var evs []protocol.SystemEvent
	eventually(t, "carol saw alice leave", func() bool {
		evs = systemEvents(t, carol, conv)
		return hasEvent(evs, "member_left", "alice", "alice", "")
	})
	for _, want := range []struct{ event, actor, user, role string }{
		{"role_changed", "alice", "bob", protocol.RoleAdmin},
		{"muted", "bob", "carol", ""},
		{"unmuted", "bob", "carol", ""},
		{"member_removed", "bob", "dave", ""},
		{"role_changed", "alice", "bob", protocol.RoleOwner},
	} {
		if !hasEvent(evs, want.event, want.actor, want.user, want.role) {
			t.Fatalf("carol's system events %+v lack %+v", evs, want)
		}
	}
	if _, err := ParseSystemEvent(&protocol.Message{Kind: protocol.KindText, Body: "{}"}); err == nil {
		t.Fatal("ParseSystemEvent accepted a text message")
	}
}

// TestE2EMentionsAndStateMessages: SendWith carries mentions and
// @everyone (the mentioned member's summary says so), SendState makes
// coalescible state messages (older ones superseded on reads).
func TestE2EMentionsAndStateMessages(t *testing.T) {
	srv := servertest.Start(t)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	g, err := alice.CreateGroup(ctx, "team", []string{"bob", "carol"})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := alice.SendWith(ctx, g.ConvID, "@bob look", SendOptions{Mentions: []string{"bob"}, ClientMsgID: "m-1"})
	if err != nil {
		t.Fatalf("SendWith mentions: %v", err)
	}
	again, err := alice.SendWith(ctx, g.ConvID, "@bob look", SendOptions{Mentions: []string{"bob"}, ClientMsgID: "m-1"})
	if err != nil || !again.Duplicate || again.Seq != ack.Seq {
		t.Fatalf("repeated SendWith = %+v, %v; want the first ack, duplicate", again, err)
	}
	eventually(t, "bob got the mention", func() bool { return bob.rec.hasSeq(g.ConvID, ack.Seq) })
	m := bob.rec.messages(g.ConvID)
	if last := m[len(m)-1]; len(last.Mentions) != 1 || last.Mentions[0] != "bob" {
		t.Fatalf("pushed message %+v lacks the mention", last)
	}
	list, err := bob.Conversations(ctx)
	if err != nil || len(list) != 1 || !list[0].Mentioned {
		t.Fatalf("bob's list %+v, %v: want mentioned", list, err)
	}
	if _, err := alice.SendWith(ctx, g.ConvID, "@everyone meeting", SendOptions{MentionAll: true}); err != nil {
		t.Fatalf("SendWith mention_all: %v", err)
	}
	// rate_limited is retried after retry_after_ms (a minute here) until
	// the context ends; the error then carries the last answer's code.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = alice.SendWith(short, g.ConvID, "@everyone again", SendOptions{MentionAll: true})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second @everyone: %v, want the context's deadline", err)
	}
	wantCode(t, "second @everyone within the minute", err, protocol.CodeRateLimited)
	dm, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	_, err = alice.SendWith(ctx, dm.ConvID, "@all", SendOptions{MentionAll: true})
	wantCode(t, "@everyone in a direct conversation", err, protocol.CodeInvalidArgument)

	// State messages: three updates of one key, only the last in full.
	var seqs []uint64
	for _, v := range []string{"10", "7", "3"} {
		a, err := alice.SendState(ctx, g.ConvID, "packet-1", v)
		if err != nil {
			t.Fatalf("SendState: %v", err)
		}
		seqs = append(seqs, a.Seq)
	}
	_, err = alice.SendState(ctx, g.ConvID, "", "x")
	wantCode(t, "SendState without key", err, protocol.CodeInvalidArgument)
	page, _, err := bob.History(ctx, g.ConvID, HistoryQuery{Forward: true, AfterSeq: seqs[0] - 1})
	if err != nil || len(page) != 3 {
		t.Fatalf("History = %d messages, %v", len(page), err)
	}
	for i, m := range page {
		last := i == 2
		if m.Kind != protocol.KindState || m.CoalesceKey != "packet-1" || m.Superseded == last || (last && m.Body != "3") || (!last && m.Body != "") {
			t.Fatalf("state message %d = %+v", i, m)
		}
	}
}

// TestE2EPresenceAndTyping: WatchPresence answers current states, changes
// arrive as EventPresence, the watch list survives a reconnect (sent
// again, answered as an EventPresence); Typing reaches the peer as
// EventTyping. Ping and RemoveKeys answer.
func TestE2EPresenceAndTyping(t *testing.T) {
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) {
		c.Presence.Flush, c.Presence.MinGap = 50*time.Millisecond, 50*time.Millisecond
	}), servertest.WithChat(func(c *chat.Config) { c.TypingInterval = 0 }))
	px := newProxy(t, srv.URL)
	alice := startE2E(t, px.url(), srv.Token("alice"), "phone", nil)
	ctx := ctxT(t)
	dm, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	_, err = alice.WatchPresence(ctx, []string{"stranger"})
	wantCode(t, "watching a stranger", err, protocol.CodeNotMember)
	states, err := alice.WatchPresence(ctx, []string{"bob"})
	if err != nil || len(states) != 1 || states[0].UserID != "bob" || states[0].Online {
		t.Fatalf("WatchPresence = %+v, %v; want bob offline", states, err)
	}
	presence := func(online bool) func() bool {
		return func() bool {
			evs, _ := alice.rec.all(EventPresence)
			for _, ev := range evs {
				for _, s := range ev.Presence {
					if s.UserID == "bob" && s.Online == online {
						return true
					}
				}
			}
			return false
		}
	}
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	eventually(t, "alice sees bob online", presence(true))

	// Typing: alice's notice reaches bob, not alice.
	if err := alice.Typing(ctx, dm.ConvID); err != nil {
		t.Fatalf("Typing: %v", err)
	}
	eventually(t, "bob sees alice typing", func() bool {
		ev := bob.rec.find(EventTyping, dm.ConvID)
		return ev != nil && ev.Typing.UserID == "alice" && ev.Typing.ConvID == dm.ConvID
	})
	if alice.rec.count(EventTyping) != 0 {
		t.Fatal("alice got her own typing notice")
	}
	err = alice.Typing(ctx, 12345)
	wantCode(t, "typing in a stranger's conversation", err, protocol.CodeNotMember)

	// bob leaves: alice sees him offline.
	bob.Close()
	eventually(t, "alice sees bob offline", presence(false))

	// A new connection of alice's (the old one cut) sends the watch list
	// again, and the answer comes as a fresh EventPresence.
	before := alice.rec.count(EventPresence)
	px.cut()
	eventually(t, "alice reconnected and watches bob again", func() bool {
		return alice.rec.count(EventConnected) > 1 && alice.rec.count(EventPresence) > before && len(px.sent(protocol.TypePresenceSub)) == 3
	})
	if subs := px.sent(protocol.TypePresenceSub); len(subs[2].Users) != 1 || subs[2].Users[0] != "bob" {
		t.Fatalf("presence_sub frames %+v: the last should watch bob", subs)
	}
	// An empty list stops watching and is not sent again.
	if states, err := alice.WatchPresence(ctx, nil); err != nil || len(states) != 0 {
		t.Fatalf("WatchPresence(nil) = %+v, %v", states, err)
	}
	if st, err := alice.Ping(ctx); err != nil || st == 0 {
		t.Fatalf("Ping = %d, %v", st, err)
	}
	if err := alice.RemoveKeys(ctx); err != nil {
		t.Fatalf("RemoveKeys: %v", err)
	}
}

// TestE2EReconnectingEvents: while the server cannot be reached every
// failed attempt is reported as EventReconnecting (with the error and the
// delay), and a dropped connection is followed by one before the next
// attempt.
func TestE2EReconnectingEvents(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL)
	px.down(true)
	rc := launch(t, testConfig(t, px.url(), srv.Token("alice"), "phone"), true)
	eventually(t, "two failed attempts reported", func() bool { return rc.rec.count(EventReconnecting) >= 2 })
	evs, _ := rc.rec.all(EventReconnecting)
	for _, ev := range evs {
		if ev.Err == nil || ev.URL != px.url() || ev.Delay < 0 {
			t.Fatalf("reconnecting event %+v: want the error, the URL and a delay", ev)
		}
	}
	if rc.rec.count(EventConnected) != 0 {
		t.Fatal("connected through a proxy that is down")
	}
	px.down(false)
	eventually(t, "connected once the server is reachable", func() bool { return rc.rec.count(EventConnected) == 1 })
	before := rc.rec.count(EventReconnecting)
	px.cut()
	eventually(t, "the drop is reported, then the reconnect", func() bool {
		return rc.rec.count(EventReconnecting) > before && rc.rec.count(EventConnected) == 2
	})
}

// TestE2ELeaveNotRepeatedAfterLostAnswer: Leave and RemoveMembers whose
// answer is lost with the connection come back as ErrDisconnected instead
// of being repeated (a repeat would answer not_member / not_found although
// the first one worked); each was done once.
func TestE2ELeaveNotRepeatedAfterLostAnswer(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, px.url(), srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	g, err := alice.CreateGroup(ctx, "team", []string{"bob", "carol", "dave"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.SetRole(ctx, g.ConvID, "bob", protocol.RoleAdmin); err != nil {
		t.Fatal(err)
	}
	lose := func() { px.setRule(onFirst(frameIs(toClient, protocol.TypeConv), dropCut)) }

	lose()
	if _, err := bob.RemoveMembers(ctx, g.ConvID, []string{"dave"}); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("RemoveMembers with a lost answer: %v, want ErrDisconnected", err)
	}
	eventually(t, "bob reconnected", func() bool { return bob.rec.count(EventConnected) == 2 })
	lose()
	if _, err := bob.Leave(ctx, g.ConvID); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("Leave with a lost answer: %v, want ErrDisconnected", err)
	}
	// Both happened once.
	info, err := alice.ConvInfo(ctx, g.ConvID)
	if err != nil || info.MemberCount != 2 {
		t.Fatalf("group after the lost answers = %+v, %v; want alice and carol", info, err)
	}
}

// TestE2EReplies: SendWith's ReplyTo is pushed and read back with the
// message, and a reference the sender may not see is refused with
// bad_reference, not retried.
func TestE2EReplies(t *testing.T) {
	srv := servertest.Start(t)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	dm, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	q, err := alice.Send(ctx, dm.ConvID, "lunch?")
	if err != nil {
		t.Fatal(err)
	}
	r, err := bob.SendWith(ctx, dm.ConvID, "yes", SendOptions{ReplyTo: q.Seq})
	if err != nil {
		t.Fatalf("SendWith reply: %v", err)
	}
	eventually(t, "alice got the reply", func() bool { return alice.rec.hasSeq(dm.ConvID, r.Seq) })
	if m := alice.rec.messages(dm.ConvID); m[len(m)-1].ReplyTo != q.Seq {
		t.Fatalf("pushed reply %+v, want reply_to %d", m[len(m)-1], q.Seq)
	}
	_, err = bob.SendWith(ctx, dm.ConvID, "to nothing", SendOptions{ReplyTo: r.Seq + 10})
	wantCode(t, "reply beyond the last seq", err, protocol.CodeBadReference)
	msgs, _, err := alice.History(ctx, dm.ConvID, HistoryQuery{Forward: true, Limit: 10})
	if err != nil || len(msgs) != 2 || msgs[1].ReplyTo != q.Seq {
		t.Fatalf("history = %+v, %v; want the reply to %d", msgs, err, q.Seq)
	}
}

// TestE2EReadBy: ReadBy counts the members who read a message and names
// them; a seq not stored is bad_reference.
func TestE2EReadBy(t *testing.T) {
	srv := servertest.Start(t)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	g, err := alice.CreateGroup(ctx, "team", []string{"bob", "carol"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := alice.Send(ctx, g.ConvID, "read me")
	if err != nil {
		t.Fatal(err)
	}
	if err := bob.MarkRead(ctx, g.ConvID, m.Seq); err != nil {
		t.Fatal(err)
	}
	rb, err := alice.ReadBy(ctx, g.ConvID, m.Seq)
	if err != nil || rb.ReadCount != 1 || rb.MemberCount != 2 || len(rb.Users) != 1 || rb.Users[0] != "bob" {
		t.Fatalf("ReadBy = %+v, %v; want bob, 1 of 2", rb, err)
	}
	_, err = alice.ReadBy(ctx, g.ConvID, m.Seq+9)
	wantCode(t, "read_by beyond the last seq", err, protocol.CodeBadReference)
}

// TestE2EReactions: React and Unreact take seqs; in a small group bob's
// stream gets each reaction event with its target's counts, in a large
// one (coalesced reactions pushes) stubs that cover every seq in order,
// the last carrying the counts (ReactionUpdate); history carries the
// counts with Me; an emoji outside the server's set (hello's reactions)
// is invalid_argument.
func TestE2EReactions(t *testing.T) {
	srv := servertest.Start(t, servertest.WithChat(func(c *chat.Config) { c.SmallBelow, c.LargeAbove, c.Hysteresis = 4, 6, 0.1 }))
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	if h, ok := alice.Hello(); !ok || len(h.Reactions) == 0 || h.MaxReactionsPerUser != 3 || h.Reactions[0] != "👍" {
		t.Fatalf("hello = %+v, want the default reactions", h)
	}
	for _, tc := range []struct {
		name    string
		members []string
	}{
		{"small", []string{"bob", "carol"}},
		{"large", []string{"bob", "c1", "c2", "c3", "c4", "c5", "c6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := alice.CreateGroup(ctx, tc.name, tc.members)
			if err != nil {
				t.Fatal(err)
			}
			m, err := alice.Send(ctx, g.ConvID, "react to me")
			if err != nil {
				t.Fatal(err)
			}
			var last Ack
			for _, e := range []string{"👍", "🎉", "❤️"} {
				if last, err = alice.React(ctx, g.ConvID, m.Seq, e); err != nil {
					t.Fatalf("React %s: %v", e, err)
				}
			}
			if last, err = alice.Unreact(ctx, g.ConvID, m.Seq, "🎉"); err != nil || last.Seq != m.Seq+4 {
				t.Fatalf("Unreact = %+v, %v; want seq %d", last, err, m.Seq+4)
			}
			eventually(t, "bob has every seq", func() bool { return bob.rec.hasSeq(g.ConvID, last.Seq) })
			want := []protocol.Reaction{{Emoji: "👍", Count: 1}, {Emoji: "❤️", Count: 1}}
			var got []protocol.Reaction
			for _, ev := range bob.rec.messages(g.ConvID) {
				if target, counts, ok := ReactionUpdate(ev); ok && target == m.Seq {
					got = counts
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("bob's counts from the stream = %+v, want %+v", got, want)
			}
			page, _, err := alice.History(ctx, g.ConvID, HistoryQuery{Forward: true, AfterSeq: m.Seq - 1})
			wantMe := []protocol.Reaction{{Emoji: "👍", Count: 1, Me: true}, {Emoji: "❤️", Count: 1, Me: true}}
			if err != nil || len(page) != 5 || !reflect.DeepEqual(page[0].Reactions, wantMe) {
				t.Fatalf("History = %+v, %v; want %d with %+v", page, err, m.Seq, wantMe)
			}
			_, err = alice.React(ctx, g.ConvID, m.Seq, "🦄")
			wantCode(t, "an emoji outside the set", err, protocol.CodeInvalidArgument)
		})
	}
}
