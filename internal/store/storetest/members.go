package storetest

import (
	"context"
	"fmt"
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

func testFanOutRows(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob", "carol")
	m := e.msg(1, "alice", "a", "to rows")
	if _, err := e.s.Append(ctx, store.Append{Msg: m, Rows: []string{"alice", "bob", "dave"}}); err != nil {
		t.Fatalf("Append: %v", err)
	}
	if _, err := e.s.Append(ctx, store.Append{Msg: e.msg(1, "alice", "b", "no rows")}); err != nil {
		t.Fatalf("Append: %v", err)
	}
	if got := e.lastSeq(t, 1); got != 2 {
		t.Errorf("conversation LastSeq = %d, want 2", got)
	}
	for _, tc := range []struct {
		user string
		want uint64
	}{{"alice", 1}, {"bob", 1}, {"carol", 0}} {
		rows, err := e.s.UserConversations(ctx, tc.user)
		if err != nil || len(rows) != 1 || rows[0].LastSeq != tc.want {
			t.Errorf("UserConversations(%s) = %+v, %v; want LastSeq %d", tc.user, rows, err, tc.want)
		}
	}
	if rows, err := e.s.UserConversations(ctx, "dave"); err != nil || len(rows) != 0 {
		t.Errorf("UserConversations(dave), not a member = %+v, %v; want none", rows, err)
	}
}
