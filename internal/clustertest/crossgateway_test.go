package clustertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/protocol"
)

// liveConn is a raw connection that records every pushed message (by conv
// and seq) while answering requests; the test's goroutine drives it.
type liveConn struct {
	t    *testing.T
	user string
	node string
	ws   *websocket.Conn
	resp chan protocol.Frame
	rid  int

	mu     sync.Mutex
	pushes map[uint64]map[uint64]protocol.Message
}

func dialLive(t *testing.T, c *Cluster, g *Proc, user string) *liveConn {
	t.Helper()
	h := http.Header{"Authorization": {"Bearer " + c.Token(user)}}
	ws, _, err := websocket.DefaultDialer.Dial(g.URL()+"/v1/ws?device=live", h)
	if err != nil {
		t.Fatalf("dial %s as %s: %v", g.Name, user, err)
	}
	l := &liveConn{t: t, user: user, ws: ws, resp: make(chan protocol.Frame, 16), pushes: make(map[uint64]map[uint64]protocol.Message)}
	hello := make(chan string, 1)
	go func() {
		defer close(l.resp)
		for {
			var f protocol.Frame
			if err := ws.ReadJSON(&f); err != nil {
				return
			}
			switch {
			case f.Type == protocol.TypeHello:
				hello <- f.Hello.Node
			case f.Type == protocol.TypeMsg && f.Message != nil:
				l.mu.Lock()
				m := l.pushes[f.Message.ConvID]
				if m == nil {
					m = make(map[uint64]protocol.Message)
					l.pushes[f.Message.ConvID] = m
				}
				m[f.Message.Seq] = *f.Message
				l.mu.Unlock()
			case f.RID != "":
				l.resp <- f
			}
		}
	}()
	t.Cleanup(func() { ws.Close() })
	select {
	case l.node = <-hello:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s on %s: no hello", user, g.Name)
	}
	return l
}

func (l *liveConn) call(f protocol.Frame, want string) *protocol.Frame {
	l.t.Helper()
	l.rid++
	f.RID = fmt.Sprintf("%s-%d", l.user, l.rid)
	if err := l.ws.WriteJSON(f); err != nil {
		l.t.Fatalf("%s: write %s: %v", l.user, f.Type, err)
	}
	timeout := time.After(20 * time.Second)
	for {
		select {
		case r, ok := <-l.resp:
			if !ok {
				l.t.Fatalf("%s: connection closed waiting for the answer to %s", l.user, f.Type)
			}
			if r.RID != f.RID {
				continue
			}
			if r.Type != want {
				l.t.Fatalf("%s: %s answered %s, want %s", l.user, f.Type, frameString(&r), want)
			}
			return &r
		case <-timeout:
			l.t.Fatalf("%s: no answer to %s within 20s", l.user, f.Type)
		}
	}
}

// has reports whether seq of conv was pushed with client_msg_id cmid.
func (l *liveConn) has(conv, seq uint64, cmid string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	m, ok := l.pushes[conv][seq]
	return ok && m.ClientMsgID == cmid
}

// sentMsg is one acknowledged send of the test.
type sentMsg struct {
	conv uint64
	seq  uint64
	cmid string
	from string
}

// TestCrossGatewayChatAllTiers: users spread over three gateways and served
// by two chat processes talk 1:1 and in a small, a medium and a large group
// (thresholds lowered to 4 and 8 members). Every online member gets every
// message by push, whichever gateway the sender is on and whichever chat
// process handles the send — including a member added to the medium and
// large groups after both chat processes have indexed them — and a member
// who was offline throughout gets everything by sync.
func TestCrossGatewayChatAllTiers(t *testing.T) {
	c := Start(t, Options{Gateways: 3, Chats: 2, Extra: []string{"--chat.small-below", "4", "--chat.large-above", "8"}})
	const offline = "zoe"
	online := make([]string, 12)
	conns := make(map[string]*liveConn)
	for i := range online {
		online[i] = fmt.Sprintf("u%02d", i)
		g := c.Gateways[i%len(c.Gateways)]
		conns[online[i]] = dialLive(t, c, g, online[i])
	}
	owner := conns["u00"]

	type conv struct {
		name    string
		id      uint64
		tier    string
		members []string // current members, offline one included
	}
	group := func(name string, members []string, wantTier string) *conv {
		r := owner.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: name, Members: members[1:]}, protocol.TypeConv)
		if r.Conv.Tier != wantTier {
			t.Fatalf("group %s of %d members has tier %q, want %q", name, len(members), r.Conv.Tier, wantTier)
		}
		return &conv{name: name, id: r.Conv.ConvID, tier: wantTier, members: members}
	}
	direct := func(a, b string) *conv {
		r := conns[a].call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: b}, protocol.TypeConv)
		return &conv{name: a + "-" + b, id: r.Conv.ConvID, tier: "direct", members: []string{a, b}}
	}
	with := func(users []string, extra ...string) []string {
		return append(append([]string(nil), users...), extra...)
	}
	convs := []*conv{
		direct("u00", "u01"), // gateways 1 and 2
		direct("u04", "u05"), // gateways 2 and 3
		direct("u03", offline),
		group("small", with(online[:2], offline), "small"),   // 3 members
		group("medium", with(online[:5], offline), "medium"), // 6 members
		group("large", with(online[:11], offline), "large"),  // 12 members
	}
	late := online[11] // joins medium and large once they are indexed

	var sent []sentMsg
	send := func(cv *conv, round int) {
		for i, u := range cv.members {
			if u == offline || i%2 == 1 && len(cv.members) > 3 {
				continue // every other member sends, spread over the gateways
			}
			cmid := fmt.Sprintf("%s-%s-%d", cv.name, u, round)
			r := conns[u].call(protocol.Frame{Type: protocol.TypeSend, ConvID: cv.id, ClientMsgID: cmid, Body: "hi " + cmid}, protocol.TypeAck)
			sent = append(sent, sentMsg{conv: cv.id, seq: r.Seq, cmid: cmid, from: u})
		}
	}
	// Several rounds so that both chat processes serve sends of every
	// conversation (NATS spreads requests over the queue group).
	for round := 0; round < 3; round++ {
		for _, cv := range convs {
			send(cv, round)
		}
	}
	for _, cv := range convs[4:] {
		r := owner.call(protocol.Frame{Type: protocol.TypeAddMembers, ConvID: cv.id, Members: []string{late}}, protocol.TypeConv)
		if r.Conv.Tier != cv.tier {
			t.Fatalf("group %s has tier %q after adding %s, want %q", cv.name, r.Conv.Tier, late, cv.tier)
		}
		cv.members = append(cv.members, late)
	}
	lateFrom := len(sent)
	byID := make(map[uint64]*conv, len(convs))
	for _, cv := range convs {
		byID[cv.id] = cv
	}
	for round := 3; round < 6; round++ {
		for _, cv := range convs {
			send(cv, round)
		}
	}

	// Every online member of each conversation (the sender included) must
	// get every message by push; the late member those sent after it joined.
	type want struct {
		user string
		m    sentMsg
		cv   *conv
	}
	var wants, lateWants []want
	for i, m := range sent {
		cv := byID[m.conv]
		for _, u := range cv.members {
			switch {
			case u == offline:
			case u == late && i >= lateFrom:
				lateWants = append(lateWants, want{u, m, cv})
			case u != late:
				wants = append(wants, want{u, m, cv})
			}
		}
	}
	missingOf := func(ws []want) (missing []string, perConv map[string]int) {
		perConv = make(map[string]int)
		for _, w := range ws {
			if !conns[w.user].has(w.m.conv, w.m.seq, w.m.cmid) {
				perConv[fmt.Sprintf("%s (on %s) in %s", w.user, conns[w.user].node, w.cv.name)]++
				missing = append(missing, fmt.Sprintf("%s (on %s) lacks %s seq %d %q from %s (on %s)",
					w.user, conns[w.user].node, w.cv.name, w.m.seq, w.m.cmid, w.m.from, conns[w.m.from].node))
			}
		}
		return missing, perConv
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		a, _ := missingOf(wants)
		b, _ := missingOf(lateWants)
		if len(a)+len(b) == 0 {
			break
		}
	}
	checkPushes := func(t *testing.T, ws []want) {
		missing, perConv := missingOf(ws)
		if len(missing) == 0 {
			return
		}
		sort.Strings(missing)
		var sum []string
		for k, n := range perConv {
			sum = append(sum, fmt.Sprintf("%s: %d missing", k, n))
		}
		sort.Strings(sum)
		var metrics []string
		for _, p := range c.Chats {
			metrics = append(metrics, c.Metrics(p, "parley_fanout", "parley_pushes", "parley_compensation"))
		}
		t.Logf("chat processes' fan-out counters:\n%s", strings.Join(metrics, "\n"))
		t.Fatalf("%d of %d expected pushes never arrived within 15s\nper member and conversation:\n%s\nfirst ones:\n%s",
			len(missing), len(ws), strings.Join(sum, "\n"), strings.Join(missing[:min(len(missing), 20)], "\n"))
	}
	t.Run("pushes_to_members_online", func(t *testing.T) { checkPushes(t, wants) })
	// A member added while online must be pushed to by every chat process,
	// not only by the one that served add_members.
	t.Run("pushes_to_member_added_while_online", func(t *testing.T) { checkPushes(t, lateWants) })
	t.Run("offline_member_syncs", func(t *testing.T) {
		// The offline member connects for the first time and syncs.
		zoe := dialLive(t, c, c.Gateways[2], offline)
		snap := zoe.call(protocol.Frame{Type: protocol.TypeSync, All: true}, protocol.TypeSnapshot)
		got := make(map[uint64]protocol.ConvSnapshot)
		for _, s := range snap.Snapshot {
			got[s.ConvID] = s
		}
		for _, cv := range convs {
			if !contains(cv.members, offline) {
				continue
			}
			s, ok := got[cv.id]
			if !ok {
				b, _ := json.Marshal(snap.Snapshot)
				t.Fatalf("%s's sync has no entry for %s (%s): %s", offline, cv.name, cv.tier, b)
			}
			bySeq := make(map[uint64]protocol.Message, len(s.Messages))
			for i, m := range s.Messages {
				if i > 0 && m.Seq != s.Messages[i-1].Seq+1 {
					t.Fatalf("%s's sync of %s: seq %d follows %d", offline, cv.name, m.Seq, s.Messages[i-1].Seq)
				}
				bySeq[m.Seq] = m
			}
			if s.MoreUnread != 0 || len(s.Messages) == 0 || s.Messages[len(s.Messages)-1].Seq != s.LastSeq {
				t.Fatalf("%s's sync of %s: %d messages up to last_seq %d, more_unread %d: want the whole range", offline, cv.name, len(s.Messages), s.LastSeq, s.MoreUnread)
			}
			for _, m := range sent {
				if m.conv != cv.id {
					continue
				}
				if got, ok := bySeq[m.seq]; !ok || got.ClientMsgID != m.cmid {
					t.Fatalf("%s's sync of %s (%s) lacks seq %d %q (has %d messages from seq %d)", offline, cv.name, cv.tier, m.seq, m.cmid, len(s.Messages), s.FromSeq+1)
				}
			}
		}
	})
	t.Logf("%d messages sent in %d conversations by members on %d gateways", len(sent), len(convs), len(c.Gateways))
}
