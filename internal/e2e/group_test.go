package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func (c *rawConn) createGroup(name string, members ...string) uint64 {
	c.t.Helper()
	return mustOK(c.t, c.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: name, Members: members}), protocol.TypeConv).Conv.ConvID
}

func (c *rawConn) addMembers(conv uint64, members ...string) *protocol.ConvInfo {
	c.t.Helper()
	return mustOK(c.t, c.call(protocol.Frame{Type: protocol.TypeAddMembers, ConvID: conv, Members: members}), protocol.TypeConv).Conv
}

func users(prefix string, from, to int) []string {
	out := make([]string, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s%d", prefix, i))
	}
	return out
}

// snapshotOf returns the HTTP snapshot entry of conv for user (from its read
// position), or nil if there is nothing new.
func snapshotOf(t *testing.T, srv *servertest.Server, user string, conv uint64) *protocol.ConvSnapshot {
	t.Helper()
	c := dialRaw(t, srv, user, "probe")
	defer c.ws.Close()
	r := mustOK(t, c.call(protocol.Frame{Type: protocol.TypeSync, All: true}), protocol.TypeSnapshot)
	for _, s := range r.Snapshot {
		if s.ConvID == conv {
			return &s
		}
	}
	return nil
}

// TestTierSwitchKeepsUnreadAndSyncRight grows a group through both
// thresholds while messages flow, then shrinks it again; an offline member
// and an online one always see the right unread count and sync result.
func TestTierSwitchKeepsUnreadAndSyncRight(t *testing.T) {
	srv := servertest.Start(t, servertest.WithChat(func(c *chat.Config) {
		c.SmallBelow, c.LargeAbove, c.Hysteresis = 6, 12, 0.25
	}))
	owner := dialRaw(t, srv, "owner", "d")
	online := dialRaw(t, srv, "online", "d")
	conv := owner.createGroup("g", "offline", "online")
	sent := uint64(0)
	send := func(n int) {
		for i := 0; i < n; i++ {
			sent++
			mustOK(t, owner.sendText(conv, fmt.Sprint("m", sent, time.Now().UnixNano()), fmt.Sprint("msg ", sent)), protocol.TypeAck)
		}
	}
	check := func(stage string) {
		t.Helper()
		list := mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List
		last := list[0].LastSeq
		for _, u := range []string{"offline", "online"} {
			s := snapshotOf(t, srv, u, conv)
			if s == nil || s.LastSeq != last || s.Unread != last || uint64(len(s.Messages)) != last || s.Messages[len(s.Messages)-1].Seq != last {
				t.Fatalf("%s: %s snapshot = %+v, want all %d messages unread", stage, u, s, last)
			}
		}
	}
	tiers := func() map[string]float64 {
		m := srv.Metrics()
		return map[string]float64{
			"small":  counter(t, m.FanoutMessages.WithLabelValues("small")),
			"medium": counter(t, m.FanoutMessages.WithLabelValues("medium")),
			"large":  counter(t, m.FanoutMessages.WithLabelValues("large")),
		}
	}
	send(3)
	check("small")
	owner.addMembers(conv, users("u", 0, 5)...) // 8 members: medium
	send(3)
	check("medium")
	owner.addMembers(conv, users("u", 5, 12)...) // 15 members: large
	send(3)
	check("large")
	rm := func(us ...string) {
		mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: conv, Members: us}), protocol.TypeConv)
	}
	rm(users("u", 9, 12)...) // 12: still large (hysteresis: down below 9)
	send(2)
	rm(users("u", 6, 9)...) // 9 members: medium
	send(2)
	check("medium again")
	rm(users("u", 1, 6)...) // 4 members: small (below 6*0.75)
	send(2)
	check("small again")
	got := tiers()
	for _, tier := range []string{"small", "medium", "large"} {
		if got[tier] == 0 {
			t.Fatalf("no message fanned out in tier %s: %v", tier, got)
		}
	}
	// The online member saw every seq by push, in some order, no gaps.
	seen := map[uint64]bool{}
	list := mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List
	for uint64(len(seen)) < list[0].LastSeq {
		f := online.nextTimeout(protocol.TypeMsg, 10*time.Second)
		if f == nil {
			t.Fatalf("online member got %d of %d seqs by push", len(seen), list[0].LastSeq)
		}
		seen[f.Message.Seq] = true
	}
}

// TestHugeGroupCostFollowsOnline: in a 100,000-member group with five
// members online, a send writes no rows and pushes to the online only.
func TestHugeGroupCostFollowsOnline(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 100,000-member group")
	}
	srv := servertest.Start(t)
	owner := dialRaw(t, srv, "owner", "d")
	conv := owner.createGroup("everyone")
	const total = 100000
	// Batches of 1,000: under -race on a loaded machine a 4,000-member
	// add_members can pass the server's 10 s request timeout.
	for from := 1; from < total; from += 1000 {
		owner.addMembers(conv, users("m", from, min(from+1000, total))...)
	}
	var watchers []*rawConn
	for i := 1; i <= 4; i++ {
		watchers = append(watchers, dialRaw(t, srv, fmt.Sprint("m", i*1000), "d"))
	}
	m := srv.Metrics()
	// The last add_members event's fan-out may still run after its answer.
	waitFor(t, func() bool {
		return counter(t, m.FanoutMessages.WithLabelValues("large"))+counter(t, m.FanoutMessages.WithLabelValues("medium")) >= 25
	})
	time.Sleep(100 * time.Millisecond)
	rows0, push0, msgs0 := counter(t, m.FanoutRows.WithLabelValues("large")), counter(t, m.FanoutPushes.WithLabelValues("large")), counter(t, m.FanoutMessages.WithLabelValues("large"))
	const sends = 20
	for i := 0; i < sends; i++ {
		mustOK(t, owner.sendText(conv, fmt.Sprint("c", i), "hello all"), protocol.TypeAck)
	}
	// The ack precedes the fan-out: wait for the last one to finish.
	waitFor(t, func() bool { return counter(t, m.FanoutMessages.WithLabelValues("large"))-msgs0 == sends })
	rows := counter(t, m.FanoutRows.WithLabelValues("large")) - rows0
	pushes := counter(t, m.FanoutPushes.WithLabelValues("large")) - push0
	msgs := counter(t, m.FanoutMessages.WithLabelValues("large")) - msgs0
	if msgs != sends || rows != 0 || pushes != sends*5 {
		t.Fatalf("%v messages: %v row writes and %v pushes, want %d, 0 and %d (5 online of %d)", msgs, rows, pushes, sends, sends*5, total)
	}
	for _, w := range watchers {
		for i := 0; i < sends; {
			f := w.nextTimeout(protocol.TypeMsg, 10*time.Second)
			if f == nil {
				t.Fatal("online member missed a push")
			}
			if f.Message.Kind == protocol.KindText && f.Message.Body == "hello all" {
				i++
			}
		}
	}
	// An offline member learns from the group's last_seq at sync.
	if s := snapshotOf(t, srv, "m99998", conv); s == nil || s.LastSeq == 0 || len(s.Messages) == 0 {
		t.Fatalf("offline member snapshot = %+v, want the latest messages", s)
	}
}

func TestOfflineMemberOf500GroupsSyncsInOneRequest(t *testing.T) {
	srv := servertest.Start(t)
	owner := dialRaw(t, srv, "owner", "d")
	for g := 0; g < 500; g++ {
		conv := owner.createGroup(fmt.Sprint("g", g), "sleeper", "other")
		owner.send(protocol.Frame{Type: protocol.TypeSend, RID: fmt.Sprint("s", g), ConvID: conv, ClientMsgID: "x", Body: "news"})
	}
	for g := 0; g < 500; g++ {
		mustOK(t, owner.next(protocol.TypeAck), protocol.TypeAck)
	}
	c := dialRaw(t, srv, "sleeper", "d")
	r := mustOK(t, c.call(protocol.Frame{Type: protocol.TypeSync, All: true}), protocol.TypeSnapshot)
	if len(r.Snapshot) != 500 {
		t.Fatalf("one sync returned %d conversations, want 500", len(r.Snapshot))
	}
	for _, s := range r.Snapshot {
		if len(s.Messages) != 1 || s.Unread != 1 {
			t.Fatalf("conv %d: %d messages, unread %d; want 1 and 1", s.ConvID, len(s.Messages), s.Unread)
		}
	}
}

// TestJoinAndLeaveBySeq: a member added while messages flow never gets an
// earlier seq, by push or sync; a removed member gets nothing after leaving.
func TestJoinAndLeaveBySeq(t *testing.T) {
	srv := servertest.Start(t)
	owner := dialRaw(t, srv, "owner", "d")
	conv := owner.createGroup("g", "talker")
	talker := dialRaw(t, srv, "talker", "d")
	late := dialRaw(t, srv, "late", "d")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			talker.send(protocol.Frame{Type: protocol.TypeSend, RID: fmt.Sprint(i), ConvID: conv, ClientMsgID: fmt.Sprint("t", i), Body: "chatter"})
			time.Sleep(2 * time.Millisecond)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	info := owner.addMembers(conv, "late")
	joinSeq := uint64(0)
	// join_seq is the group's last seq + 1 at the join: the member_added
	// event or a message right before it.
	r := mustOK(t, late.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List
	joinSeq = r[0].JoinSeq
	if joinSeq == 0 || joinSeq > info.LastSeq {
		t.Fatalf("join_seq %d, conv last %d", joinSeq, info.LastSeq)
	}
	time.Sleep(50 * time.Millisecond)
	mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: conv, Members: []string{"late"}}), protocol.TypeConv)
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()

	left := mustOK(t, late.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List[0]
	if left.LeaveSeq == 0 || left.LeaveSeq < joinSeq {
		t.Fatalf("leave_seq = %d, join_seq %d", left.LeaveSeq, joinSeq)
	}
	// Pushes: nothing below join_seq, nothing above leave_seq.
	for {
		f := late.nextTimeout(protocol.TypeMsg, 300*time.Millisecond)
		if f == nil {
			break
		}
		if s := f.Message.Seq; s < joinSeq || s > left.LeaveSeq {
			t.Fatalf("late member was pushed seq %d outside [%d, %d]", s, joinSeq, left.LeaveSeq)
		}
	}
	// Sync and history: the same window.
	snap := mustOK(t, late.call(protocol.Frame{Type: protocol.TypeSync, All: true}), protocol.TypeSnapshot).Snapshot
	for _, s := range snap {
		for _, m := range s.Messages {
			if m.Seq < joinSeq || m.Seq > left.LeaveSeq {
				t.Fatalf("sync gave seq %d outside [%d, %d]", m.Seq, joinSeq, left.LeaveSeq)
			}
		}
	}
	zero := uint64(0)
	h := mustOK(t, late.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, AfterSeq: &zero, Limit: 200}), protocol.TypeHistory)
	for _, m := range h.Messages {
		if m.Seq < joinSeq || m.Seq > left.LeaveSeq {
			t.Fatalf("history gave seq %d outside [%d, %d]", m.Seq, joinSeq, left.LeaveSeq)
		}
	}
	if len(h.Messages) == 0 || h.Messages[0].Seq != joinSeq {
		t.Fatalf("history starts at %v, want join_seq %d", h.Messages, joinSeq)
	}
	// A removed member can no longer send.
	if r := late.sendText(conv, "after", "x"); r.Code != protocol.CodeNotMember {
		t.Fatalf("send after removal = %s %s, want not_member", r.Type, r.Code)
	}
}

func TestPermissionMatrix(t *testing.T) {
	srv := servertest.Start(t)
	owner := dialRaw(t, srv, "owner", "d")
	admin := dialRaw(t, srv, "adm", "d")
	member := dialRaw(t, srv, "member", "d")
	outsider := dialRaw(t, srv, "outsider", "d")
	conv := owner.createGroup("g", "adm", "member", "victim")
	mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeSetRole, ConvID: conv, UserID: "adm", Role: protocol.RoleAdmin}), protocol.TypeConv)
	tests := []struct {
		name string
		c    *rawConn
		f    protocol.Frame
		want protocol.Code
	}{
		{"member adds", member, protocol.Frame{Type: protocol.TypeAddMembers, ConvID: conv, Members: []string{"x"}}, protocol.CodeForbidden},
		{"member removes", member, protocol.Frame{Type: protocol.TypeRemove, ConvID: conv, Members: []string{"victim"}}, protocol.CodeForbidden},
		{"member mutes", member, protocol.Frame{Type: protocol.TypeMute, ConvID: conv, UserID: "victim", Muted: true}, protocol.CodeForbidden},
		{"member sets role", member, protocol.Frame{Type: protocol.TypeSetRole, ConvID: conv, UserID: "victim", Role: protocol.RoleAdmin}, protocol.CodeForbidden},
		{"admin removes owner", admin, protocol.Frame{Type: protocol.TypeRemove, ConvID: conv, Members: []string{"owner"}}, protocol.CodeForbidden},
		{"admin mutes owner", admin, protocol.Frame{Type: protocol.TypeMute, ConvID: conv, UserID: "owner", Muted: true}, protocol.CodeForbidden},
		{"admin sets role", admin, protocol.Frame{Type: protocol.TypeSetRole, ConvID: conv, UserID: "member", Role: protocol.RoleAdmin}, protocol.CodeForbidden},
		{"outsider sends", outsider, protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "o", Body: "x"}, protocol.CodeNotMember},
		{"outsider reads history", outsider, protocol.Frame{Type: protocol.TypeHistory, ConvID: conv}, protocol.CodeNotMember},
		{"outsider adds", outsider, protocol.Frame{Type: protocol.TypeAddMembers, ConvID: conv, Members: []string{"x"}}, protocol.CodeNotMember},
		{"outsider watches presence", outsider, protocol.Frame{Type: protocol.TypePresenceSub, Users: []string{"member"}}, protocol.CodeNotMember},
		{"outsider types", outsider, protocol.Frame{Type: protocol.TypeTyping, ConvID: conv}, protocol.CodeNotMember},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.c.call(tc.f)
			if r.Type != protocol.TypeError || r.Code != tc.want {
				t.Fatalf("got %s %s (%s), want error %s", r.Type, r.Code, r.Error, tc.want)
			}
		})
	}
	// Allowed: admin mutes a member, who then cannot send; the owner
	// removes the admin.
	mustOK(t, admin.call(protocol.Frame{Type: protocol.TypeMute, ConvID: conv, UserID: "member", Muted: true}), protocol.TypeConv)
	if r := member.sendText(conv, "m1", "x"); r.Code != protocol.CodeForbidden {
		t.Fatalf("muted member send = %s %s, want forbidden", r.Type, r.Code)
	}
	mustOK(t, admin.call(protocol.Frame{Type: protocol.TypeMute, ConvID: conv, UserID: "member", Muted: false}), protocol.TypeConv)
	mustOK(t, member.sendText(conv, "m2", "x"), protocol.TypeAck)
	mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: conv, Members: []string{"adm"}}), protocol.TypeConv)
	mustOK(t, member.call(protocol.Frame{Type: protocol.TypePresenceSub, Users: []string{"owner"}}), protocol.TypePresence)
}

// flakyStore fails conversation-row writes while fail is set.
type flakyStore struct {
	store.Store
	fail  atomic.Bool
	tries atomic.Int64
}

func (f *flakyStore) UpdateRows(ctx context.Context, conv, seq uint64, users []string, mention bool) error {
	f.tries.Add(1)
	if f.fail.Load() {
		return errors.New("injected row failure")
	}
	return f.Store.UpdateRows(ctx, conv, seq, users, mention)
}

func TestCompensationConvergesAfterFault(t *testing.T) {
	flaky := &flakyStore{}
	srv := servertest.Start(t, servertest.WithDeps(func(d *server.Deps) {
		d.WrapStore = func(s store.Store) store.Store { flaky.Store = s; return flaky }
	}), servertest.WithChat(func(c *chat.Config) {
		c.InlineRows = 0 // rows by fan-out, which the fault hits
	}))
	owner := dialRaw(t, srv, "owner", "d")
	conv := owner.createGroup("g", "a", "b")
	flaky.fail.Store(true)
	for i := 0; i < 5; i++ {
		mustOK(t, owner.sendText(conv, fmt.Sprint("f", i), "during the fault"), protocol.TypeAck)
	}
	mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "all", Body: "@all", MentionAll: true}), protocol.TypeAck)
	// Messages are stored and readable despite the failing rows.
	if h := owner.history(conv); len(h) != 6 {
		t.Fatalf("history has %d messages, want 6", len(h))
	}
	before := flaky.tries.Load()
	time.Sleep(300 * time.Millisecond)
	if flaky.tries.Load() == before {
		t.Fatal("no retry of the failed row writes")
	}
	flaky.fail.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a := dialRaw(t, srv, "a", "d")
		l := mustOK(t, a.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List
		a.ws.Close()
		// The list is right at once (last_seq and @everyone come from
		// the conversation); the rows follow by compensation.
		if len(l) != 1 || l[0].Unread != 6 || !l[0].Mentioned {
			t.Fatalf("conversation list during compensation: %+v", l)
		}
		if n := counter(t, srv.Metrics().Compensations.WithLabelValues("rows")); n >= 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("row tasks did not complete")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestEveryoneIsRateLimitedAndFlagsRows(t *testing.T) {
	srv := servertest.Start(t)
	owner := dialRaw(t, srv, "owner", "d")
	conv := owner.createGroup("g", "a")
	mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "e1", Body: "hey all", MentionAll: true}), protocol.TypeAck)
	r := owner.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "e2", Body: "again", MentionAll: true})
	if r.Code != protocol.CodeRateLimited || r.RetryAfter <= 0 {
		t.Fatalf("second @everyone = %s %s retry %d, want rate_limited with retry_after_ms", r.Type, r.Code, r.RetryAfter)
	}
	a := dialRaw(t, srv, "a", "d")
	l := mustOK(t, a.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List
	if len(l) != 1 || !l[0].Mentioned {
		t.Fatalf("list = %+v, want the mention flag", l)
	}
	mustOK(t, a.call(protocol.Frame{Type: protocol.TypeRead, ConvID: conv, Seq: l[0].LastSeq}), protocol.TypeOK)
	if l := mustOK(t, a.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List; l[0].Mentioned {
		t.Fatal("mention flag stays after reading")
	}
}

func TestCoalescibleStateKeepsLatest(t *testing.T) {
	srv := servertest.Start(t)
	owner := dialRaw(t, srv, "owner", "d")
	conv := owner.createGroup("g", "offline")
	for i := 1; i <= 10; i++ {
		mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: fmt.Sprint("s", i), Kind: protocol.KindState, CoalesceKey: "packet-1", Body: fmt.Sprintf(`{"left":%d}`, 10-i)}), protocol.TypeAck)
	}
	mustOK(t, owner.sendText(conv, "t", "text after"), protocol.TypeAck)
	s := snapshotOf(t, srv, "offline", conv)
	if s == nil || len(s.Messages) != 11 {
		t.Fatalf("snapshot = %+v, want 11 seqs (dense)", s)
	}
	for _, m := range s.Messages[:9] {
		if !m.Superseded || m.Body != "" {
			t.Fatalf("intermediate state %+v, want superseded without body", m)
		}
	}
	if last := s.Messages[9]; last.Superseded || last.Body != `{"left":0}` {
		t.Fatalf("final state = %+v, want its body", last)
	}
	var body map[string]int
	if err := json.Unmarshal([]byte(s.Messages[9].Body), &body); err != nil || body["left"] != 0 {
		t.Fatalf("final state body %q", s.Messages[9].Body)
	}
}

func TestPresenceAggregatedAndTyping(t *testing.T) {
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) {
		c.Presence.Flush = 50 * time.Millisecond
		c.Presence.MinGap = 400 * time.Millisecond
	}))
	watcher := dialRaw(t, srv, "watcher", "d")
	conv := watcher.openDirect("flapper")
	r := mustOK(t, watcher.call(protocol.Frame{Type: protocol.TypePresenceSub, Users: []string{"flapper"}}), protocol.TypePresence)
	if len(r.States) != 1 || r.States[0].Online {
		t.Fatalf("initial presence = %+v, want flapper offline", r.States)
	}
	// Flap 20 times: at most one batch per MinGap (plus the first and the
	// final state), however long the flapping takes; final state offline.
	flapStart := time.Now()
	for i := 0; i < 20; i++ {
		c := dialRaw(t, srv, "flapper", "d")
		_ = c.ws.Close()
		<-c.done
		time.Sleep(40 * time.Millisecond)
	}
	maxBatches := int(time.Since(flapStart)/(400*time.Millisecond)) + 2
	time.Sleep(time.Second)
	batches, last := 0, protocol.PresenceState{}
	for {
		f := watcher.nextTimeout(protocol.TypePresence, 100*time.Millisecond)
		if f == nil {
			break
		}
		batches++
		last = f.States[len(f.States)-1]
	}
	if batches == 0 || batches > maxBatches || last.Online || last.LastSeen == 0 {
		t.Fatalf("%d presence batches for 20 flaps, last %+v; want 1..%d ending offline with last_seen", batches, last, maxBatches)
	}
	// Typing: pushed to the peer, never stored, extra notices dropped.
	flapper := dialRaw(t, srv, "flapper", "d")
	mustOK(t, flapper.call(protocol.Frame{Type: protocol.TypeTyping, ConvID: conv}), protocol.TypeOK)
	mustOK(t, flapper.call(protocol.Frame{Type: protocol.TypeTyping, ConvID: conv}), protocol.TypeOK)
	if f := watcher.next(protocol.TypeTyping); f.UserID != "flapper" || f.ConvID != conv {
		t.Fatalf("typing push = %+v", f)
	}
	if f := watcher.nextTimeout(protocol.TypeTyping, 300*time.Millisecond); f != nil {
		t.Fatal("second typing notice within the interval was forwarded")
	}
	if h := watcher.history(conv); len(h) != 0 {
		t.Fatalf("typing stored %d messages", len(h))
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRemovedMemberIsPushedItsRemoval: the removal event is the last thing
// a removed member sees, pushed to its online devices like any message.
func TestRemovedMemberIsPushedItsRemoval(t *testing.T) {
	srv := servertest.Start(t)
	owner := dialRaw(t, srv, "owner", "d")
	conv := owner.createGroup("g", "stays", "goes")
	goes := dialRaw(t, srv, "goes", "d")
	owner.sendText(conv, "m1", "before")
	mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: conv, Members: []string{"goes"}}), protocol.TypeConv)
	left := mustOK(t, goes.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList).List[0]
	for {
		f := goes.nextTimeout(protocol.TypeMsg, 10*time.Second)
		if f == nil {
			t.Fatalf("the removed member was never pushed its removal (leave_seq %d)", left.LeaveSeq)
		}
		if f.Message.Seq == left.LeaveSeq {
			if f.Message.Kind != protocol.KindSystem || !strings.Contains(f.Message.Body, "member_removed") {
				t.Fatalf("push at leave_seq is %+v, want the member_removed event", f.Message)
			}
			return
		}
	}
}
