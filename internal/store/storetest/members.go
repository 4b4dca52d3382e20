package storetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

func testCreateConversation(t *testing.T, e *env) {
	ctx := context.Background()
	c := store.Conversation{ID: 7, Kind: store.Group, Name: "team", CreatedAt: baseTime, LastSeq: 99, Members: 99}
	members := []store.Member{
		{UserID: "alice", Role: store.RoleOwner, JoinSeq: 50},
		{UserID: "bob", Role: store.RoleMember},
	}
	if err := e.s.CreateConversation(ctx, c, members); err != nil {
		t.Fatalf("CreateConversation: %v", err)
	}
	got, err := e.s.Conversation(ctx, 7)
	want := store.Conversation{ID: 7, Kind: store.Group, Name: "team", CreatedAt: baseTime, LastSeq: 0, Members: 2}
	if err != nil || got != want {
		t.Errorf("Conversation = %+v, %v; want %+v", got, err, want)
	}
	err = e.s.CreateConversation(ctx, store.Conversation{ID: 7, Kind: store.Group}, nil)
	wantErr(t, "second CreateConversation", err, store.ErrExists)

	ms, err := e.s.Members(ctx, 7)
	if err != nil || len(ms) != 2 {
		t.Fatalf("Members = %+v, %v; want 2", ms, err)
	}
	byUser := map[string]store.Member{}
	for _, m := range ms {
		byUser[m.UserID] = m
	}
	for _, w := range []store.Member{
		{ConvID: 7, UserID: "alice", Role: store.RoleOwner, JoinSeq: 1},
		{ConvID: 7, UserID: "bob", Role: store.RoleMember, JoinSeq: 1},
	} {
		if byUser[w.UserID] != w {
			t.Errorf("member %s = %+v, want %+v", w.UserID, byUser[w.UserID], w)
		}
		if m, err := e.s.Member(ctx, 7, w.UserID); err != nil || m != w {
			t.Errorf("Member(%s) = %+v, %v; want %+v", w.UserID, m, err, w)
		}
		rows, err := e.s.UserConversations(ctx, w.UserID)
		wantRow := store.ConvRow{ConvID: 7, UserID: w.UserID, Kind: store.Group, JoinSeq: 1}
		if err != nil || len(rows) != 1 || rows[0] != wantRow {
			t.Errorf("UserConversations(%s) = %+v, %v; want [%+v]", w.UserID, rows, err, wantRow)
		}
	}
}

func testDirectConcurrent(t *testing.T, e *env) {
	ctx := context.Background()
	type result struct {
		c   store.Conversation
		err error
	}
	results := make([]result, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			a, b := "alice", "bob"
			if i%2 == 1 {
				a, b = b, a
			}
			c, err := e.s.Direct(ctx, a, b, uint64(100+i), baseTime)
			results[i] = result{c, err}
		})
	}
	wg.Wait()
	id := results[0].c.ID
	for i, r := range results {
		if r.err != nil || r.c.ID != id || r.c.Kind != store.Direct || r.c.Members != 2 {
			t.Errorf("Direct #%d = %+v, %v; want direct conversation %d with 2 members", i, r.c, r.err, id)
		}
	}
	if id < 100 || id >= 100+workers {
		t.Fatalf("Direct id = %d, want one of the offered ids", id)
	}
	for _, u := range []string{"alice", "bob"} {
		m, err := e.s.Member(ctx, id, u)
		if err != nil || m.JoinSeq != 1 {
			t.Errorf("Member(%s) = %+v, %v; want JoinSeq 1", u, m, err)
		}
		rows, err := e.s.UserConversations(ctx, u)
		if err != nil || len(rows) != 1 || rows[0].ConvID != id || rows[0].Kind != store.Direct || rows[0].JoinSeq != 1 {
			t.Errorf("UserConversations(%s) = %+v, %v; want one direct row for %d", u, rows, err, id)
		}
	}
	other, err := e.s.Direct(ctx, "alice", "carol", 200, baseTime)
	if err != nil || other.ID != 200 {
		t.Errorf("Direct(alice, carol) = %+v, %v; want new conversation 200", other, err)
	}
	// An id already taken by another conversation is refused.
	_, err = e.s.Direct(ctx, "dave", "erin", 200, baseTime)
	wantErr(t, "Direct with a taken id", err, store.ErrExists)
}

func testAddMembers(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	e.send(t, 1, "alice", 3)
	got, err := e.s.AddMembers(ctx, 1, []string{"bob", "carol", "alice"}, store.RoleMember)
	if err != nil {
		t.Fatalf("AddMembers: %v", err)
	}
	want := []store.Member{
		{ConvID: 1, UserID: "bob", Role: store.RoleMember, JoinSeq: 4},
		{ConvID: 1, UserID: "carol", Role: store.RoleMember, JoinSeq: 4},
		{ConvID: 1, UserID: "alice", Role: store.RoleMember, JoinSeq: 1},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("AddMembers = %+v, want %+v", got, want)
	}
	c, err := e.s.Conversation(ctx, 1)
	if err != nil || c.Members != 3 {
		t.Errorf("Conversation.Members = %d, %v; want 3", c.Members, err)
	}
	rows, err := e.s.UserConversations(ctx, "bob")
	wantRow := store.ConvRow{ConvID: 1, UserID: "bob", Kind: store.Group, JoinSeq: 4, LastSeq: 3}
	if err != nil || len(rows) != 1 || rows[0] != wantRow {
		t.Errorf("UserConversations(bob) = %+v, %v; want [%+v] (unread starts at 0)", rows, err, wantRow)
	}
	if next := e.send(t, 1, "bob", 1)[0]; next.Seq != 4 {
		t.Errorf("first message after the join got seq %d, want 4 (= JoinSeq)", next.Seq)
	}
	again, err := e.s.AddMembers(ctx, 1, []string{"bob", "dave"}, store.RoleAdmin)
	wantAgain := []store.Member{
		{ConvID: 1, UserID: "bob", Role: store.RoleMember, JoinSeq: 4},
		{ConvID: 1, UserID: "dave", Role: store.RoleAdmin, JoinSeq: 5},
	}
	if err != nil || fmt.Sprint(again) != fmt.Sprint(wantAgain) {
		t.Errorf("second AddMembers = %+v, %v; want %+v", again, err, wantAgain)
	}
	if c, err := e.s.Conversation(ctx, 1); err != nil || c.Members != 4 {
		t.Errorf("Conversation.Members = %d, %v; want 4", c.Members, err)
	}
}

// userIDs returns the user ids of ms.
func userIDs(ms []store.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.UserID
	}
	slices.Sort(out)
	return out
}

func testRemoveMembers(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob", "carol")
	e.send(t, 1, "alice", 3)
	got, err := e.s.RemoveMembers(ctx, 1, []string{"bob", "dave", "bob", ""})
	wantBob := store.Member{ConvID: 1, UserID: "bob", Role: store.RoleMember, JoinSeq: 1, LeaveSeq: 3}
	if err != nil || len(got) != 1 || got[0] != wantBob {
		t.Fatalf("RemoveMembers(bob, dave, bob) = %+v, %v; want [%+v]", got, err, wantBob)
	}
	again, err := e.s.RemoveMembers(ctx, 1, []string{"bob"})
	if err != nil || len(again) != 0 {
		t.Errorf("RemoveMembers of a former member = %+v, %v; want none", again, err)
	}
	check := func(when string) {
		t.Helper()
		if ms, err := e.s.Members(ctx, 1); err != nil || !slices.Equal(userIDs(ms), []string{"alice", "carol"}) {
			t.Errorf("%s: Members = %+v, %v; want alice and carol", when, ms, err)
		}
		if m, err := e.s.Member(ctx, 1, "bob"); err != nil || m != wantBob {
			t.Errorf("%s: Member(bob) = %+v, %v; want the former membership %+v", when, m, err, wantBob)
		}
		if c, err := e.s.Conversation(ctx, 1); err != nil || c.Members != 2 {
			t.Errorf("%s: Conversation.Members = %d, %v; want 2", when, c.Members, err)
		}
		// The row stays in the former member's list, ending at the leave.
		wantRow := store.ConvRow{ConvID: 1, UserID: "bob", Kind: store.Group, JoinSeq: 1, LeaveSeq: 3, LastSeq: 3}
		if r := e.row(t, "bob", 1); r != wantRow {
			t.Errorf("%s: bob's row = %+v, want %+v", when, r, wantRow)
		}
	}
	check("after remove")
	wantErr(t, "SetRole(former member)", e.s.SetRole(ctx, 1, "bob", store.RoleAdmin), store.ErrNotMember)
	wantErr(t, "SetMuted(former member)", e.s.SetMuted(ctx, 1, "bob", true), store.ErrNotMember)
	e.reopen(t)
	check("after reopen")
	if next := e.send(t, 1, "alice", 1)[0]; next.Seq != 4 {
		t.Errorf("append after a leave got seq %d, want 4 (a leave takes no seq)", next.Seq)
	}
}

// testRemoveBeforeFirstMessage: a leave is decided by seq, and before the
// first message there is none to record (LeaveSeq 0 means a current member).
func testRemoveBeforeFirstMessage(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob")
	_, err := e.s.RemoveMembers(ctx, 1, []string{"bob"})
	wantErr(t, "RemoveMembers before the first message", err, store.ErrConflict)
	if m, err := e.s.Member(ctx, 1, "bob"); err != nil || m.LeaveSeq != 0 {
		t.Errorf("Member(bob) after the refused remove = %+v, %v; want a current member", m, err)
	}
	if c, err := e.s.Conversation(ctx, 1); err != nil || c.Members != 2 {
		t.Errorf("Conversation.Members after the refused remove = %d, %v; want 2", c.Members, err)
	}
	if got, err := e.s.RemoveMembers(ctx, 1, []string{"dave"}); err != nil || len(got) != 0 {
		t.Errorf("RemoveMembers(non-member) before the first message = %+v, %v; want none, nil", got, err)
	}
	e.send(t, 1, "alice", 1)
	if got, err := e.s.RemoveMembers(ctx, 1, []string{"bob"}); err != nil || len(got) != 1 || got[0].LeaveSeq != 1 {
		t.Errorf("RemoveMembers after seq 1 = %+v, %v; want LeaveSeq 1", got, err)
	}
}

func testRejoin(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob")
	e.send(t, 1, "alice", 2)
	if err := e.s.SetRole(ctx, 1, "bob", store.RoleAdmin); err != nil {
		t.Fatalf("SetRole: %v", err)
	}
	if err := e.s.SetMuted(ctx, 1, "bob", true); err != nil {
		t.Fatalf("SetMuted: %v", err)
	}
	if _, err := e.s.RemoveMembers(ctx, 1, []string{"bob"}); err != nil {
		t.Fatalf("RemoveMembers: %v", err)
	}
	e.send(t, 1, "alice", 2)
	if err := e.s.UpdateRows(ctx, 1, 4, []string{"alice", "bob"}, true); err != nil {
		t.Fatalf("UpdateRows: %v", err)
	}
	// A rejoin is a new membership: history up to it stays hidden.
	got, err := e.s.AddMembers(ctx, 1, []string{"bob", "alice"}, store.RoleMember)
	want := []store.Member{
		{ConvID: 1, UserID: "bob", Role: store.RoleMember, JoinSeq: 5},
		{ConvID: 1, UserID: "alice", Role: store.RoleMember, JoinSeq: 1},
	}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("AddMembers(former bob, alice) = %+v, %v; want %+v", got, err, want)
	}
	if m, err := e.s.Member(ctx, 1, "bob"); err != nil || m != want[0] {
		t.Errorf("Member(bob) after rejoin = %+v, %v; want %+v", m, err, want[0])
	}
	if c, err := e.s.Conversation(ctx, 1); err != nil || c.Members != 2 {
		t.Errorf("Conversation.Members after rejoin = %d, %v; want 2", c.Members, err)
	}
	// The row starts at the join with no unread, and is never lowered.
	wantRow := store.ConvRow{ConvID: 1, UserID: "bob", Kind: store.Group, JoinSeq: 5, LastSeq: 4}
	if r := e.row(t, "bob", 1); r != wantRow {
		t.Errorf("bob's row after rejoin = %+v, want %+v", r, wantRow)
	}
	if next := e.send(t, 1, "bob", 1)[0]; next.Seq != 5 {
		t.Errorf("first message after the rejoin got seq %d, want 5 (= JoinSeq)", next.Seq)
	}
	// Joining and leaving with no message between: LeaveSeq < JoinSeq, the
	// membership saw nothing.
	if _, err := e.s.AddMembers(ctx, 1, []string{"carol"}, store.RoleMember); err != nil {
		t.Fatalf("AddMembers(carol): %v", err)
	}
	left, err := e.s.RemoveMembers(ctx, 1, []string{"carol"})
	wantCarol := store.Member{ConvID: 1, UserID: "carol", Role: store.RoleMember, JoinSeq: 6, LeaveSeq: 5}
	if err != nil || len(left) != 1 || left[0] != wantCarol {
		t.Errorf("RemoveMembers(carol) right after joining = %+v, %v; want [%+v]", left, err, wantCarol)
	}
	e.reopen(t)
	ms, err := e.s.Members(ctx, 1)
	slices.SortFunc(ms, func(a, b store.Member) int { return strings.Compare(a.UserID, b.UserID) })
	if err != nil || !slices.Equal(ms, []store.Member{{ConvID: 1, UserID: "alice", JoinSeq: 1}, want[0]}) {
		t.Errorf("Members after reopen = %+v, %v; want alice and the rejoined bob", ms, err)
	}
}

func testSetRoleMuted(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob")
	if err := e.s.SetRole(ctx, 1, "bob", store.RoleAdmin); err != nil {
		t.Fatalf("SetRole: %v", err)
	}
	if err := e.s.SetMuted(ctx, 1, "bob", true); err != nil {
		t.Fatalf("SetMuted: %v", err)
	}
	want := store.Member{ConvID: 1, UserID: "bob", Role: store.RoleAdmin, JoinSeq: 1, Muted: true}
	if m, err := e.s.Member(ctx, 1, "bob"); err != nil || m != want {
		t.Errorf("Member(bob) = %+v, %v; want %+v", m, err, want)
	}
	if ms, err := e.s.Members(ctx, 1); err != nil || len(ms) != 2 || !slices.Contains(ms, want) {
		t.Errorf("Members = %+v, %v; want alice and %+v", ms, err, want)
	}
	if err := e.s.SetRole(ctx, 1, "bob", store.RoleAdmin); err != nil {
		t.Errorf("SetRole to the current role: %v", err)
	}
	e.reopen(t)
	if m, err := e.s.Member(ctx, 1, "bob"); err != nil || m != want {
		t.Errorf("after reopen: Member(bob) = %+v, %v; want %+v", m, err, want)
	}
	if err := e.s.SetMuted(ctx, 1, "bob", false); err != nil {
		t.Fatalf("SetMuted(false): %v", err)
	}
	want.Muted = false
	if m, err := e.s.Member(ctx, 1, "bob"); err != nil || m != want {
		t.Errorf("Member(bob) after unmute = %+v, %v; want %+v (role kept)", m, err, want)
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"SetRole(non-member)", e.s.SetRole(ctx, 1, "dave", store.RoleAdmin)},
		{"SetMuted(non-member)", e.s.SetMuted(ctx, 1, "dave", true)},
		{"SetRole(unknown conversation)", e.s.SetRole(ctx, 404, "alice", store.RoleAdmin)},
		{"SetMuted(unknown conversation)", e.s.SetMuted(ctx, 404, "alice", true)},
	} {
		wantErr(t, tc.name, tc.err, store.ErrNotMember)
	}
}

func testSetTier(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	if c, err := e.s.Conversation(ctx, 1); err != nil || c.Tier != 0 {
		t.Errorf("Tier of a new conversation = %d, %v; want 0", c.Tier, err)
	}
	if err := e.s.SetTier(ctx, 1, 2); err != nil {
		t.Fatalf("SetTier: %v", err)
	}
	// Appends and membership changes rewrite the conversation's row; the
	// tier must survive them.
	e.send(t, 1, "alice", 2)
	if _, err := e.s.AddMembers(ctx, 1, []string{"bob"}, store.RoleMember); err != nil {
		t.Fatalf("AddMembers: %v", err)
	}
	if _, err := e.s.RemoveMembers(ctx, 1, []string{"bob"}); err != nil {
		t.Fatalf("RemoveMembers: %v", err)
	}
	want := store.Conversation{ID: 1, Kind: store.Group, Name: "group 1", CreatedAt: baseTime, LastSeq: 2, Members: 1, Tier: 2}
	if c, err := e.s.Conversation(ctx, 1); err != nil || c != want {
		t.Errorf("Conversation = %+v, %v; want %+v", c, err, want)
	}
	e.reopen(t)
	if c, err := e.s.Conversation(ctx, 1); err != nil || c != want {
		t.Errorf("after reopen: Conversation = %+v, %v; want %+v", c, err, want)
	}
	if err := e.s.SetTier(ctx, 1, 0); err != nil {
		t.Fatalf("SetTier(0): %v", err)
	}
	if c, err := e.s.Conversation(ctx, 1); err != nil || c.Tier != 0 {
		t.Errorf("Tier after SetTier(0) = %d, %v; want 0", c.Tier, err)
	}
	wantErr(t, "SetTier(unknown conversation)", e.s.SetTier(ctx, 404, 1), store.ErrNotFound)
}

// testMembershipConcurrent joins and leaves members while they and others
// append: each membership must bracket the messages its member sent while
// in it (decided by seq, under the seq lock), and the member count must
// match the member list.
func testMembershipConcurrent(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "owner")
	e.send(t, 1, "owner", 1)
	const rounds = 5
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			user := fmt.Sprintf("m%d", w)
			for r := range rounds {
				joined, err := e.s.AddMembers(ctx, 1, []string{user}, store.RoleMember)
				if err != nil || len(joined) != 1 {
					t.Errorf("AddMembers(%s) = %+v, %v", user, joined, err)
					return
				}
				res, err := e.s.Append(ctx, store.Append{Msg: e.msg(1, user, "", "hi")})
				if err != nil {
					t.Errorf("Append: %v", err)
					return
				}
				if w%2 == 1 && r == rounds-1 {
					break // odd workers stay
				}
				left, err := e.s.RemoveMembers(ctx, 1, []string{user})
				if err != nil || len(left) != 1 {
					t.Errorf("RemoveMembers(%s) = %+v, %v", user, left, err)
					return
				}
				j, l, s := joined[0].JoinSeq, left[0].LeaveSeq, res.Msg.Seq
				if s < j || s > l {
					t.Errorf("%s round %d: sent seq %d outside its membership [%d, %d]", user, r, s, j, l)
				}
			}
		})
	}
	wg.Wait()
	ms, err := e.s.Members(ctx, 1)
	if err != nil {
		t.Fatalf("Members: %v", err)
	}
	want := []string{"owner"}
	for w := 1; w < workers; w += 2 {
		want = append(want, fmt.Sprintf("m%d", w))
	}
	slices.Sort(want)
	if got := userIDs(ms); !slices.Equal(got, want) {
		t.Errorf("Members = %v, want %v", got, want)
	}
	if c, err := e.s.Conversation(ctx, 1); err != nil || c.Members != len(want) {
		t.Errorf("Conversation.Members = %d, %v; want %d", c.Members, err, len(want))
	}
}
