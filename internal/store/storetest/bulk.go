package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// testMembersBulk: one AddMembers and one RemoveMembers of hundreds of
// users (more than one write batch of the Cassandra store), mixing new
// users, current members, former members who rejoin and repeated ids.
// Every returned membership, row and the member count must be what the
// one-by-one changes would leave.
func testMembersBulk(t *testing.T, e *env) {
	ctx := context.Background()
	const n = 300
	user := func(i int) string { return fmt.Sprintf("u%03d", i) }
	e.group(t, 1, "owner", user(0), user(1), user(2))
	e.send(t, 1, "owner", 2)
	// u003..u009 join and leave before the bulk change: former members.
	var former []string
	for i := 3; i < 10; i++ {
		former = append(former, user(i))
	}
	if _, err := e.s.AddMembers(ctx, 1, former, store.RoleAdmin); err != nil {
		t.Fatalf("AddMembers(former): %v", err)
	}
	e.send(t, 1, "owner", 1)
	if left, err := e.s.RemoveMembers(ctx, 1, former); err != nil || len(left) != len(former) {
		t.Fatalf("RemoveMembers(former) = %d, %v; want %d", len(left), err, len(former))
	}
	e.send(t, 1, "owner", 1)
	last := e.lastSeq(t, 1) // 4

	var users []string
	for i := range n {
		users = append(users, user(i))
		if i%50 == 0 {
			users = append(users, user(i)) // repeated: one membership
		}
	}
	got, err := e.s.AddMembers(ctx, 1, users, store.RoleMember)
	if err != nil {
		t.Fatalf("AddMembers(%d users): %v", len(users), err)
	}
	if len(got) != len(users) {
		t.Fatalf("AddMembers returned %d memberships for %d users", len(got), len(users))
	}
	for i, m := range got {
		want := store.Member{ConvID: 1, UserID: users[i], Role: store.RoleMember, JoinSeq: last + 1}
		if u := users[i]; u < user(3) {
			want.JoinSeq = 1 // current members: unchanged
		}
		if m != want {
			t.Fatalf("AddMembers[%d] = %+v, want %+v", i, m, want)
		}
	}
	ms, err := e.s.Members(ctx, 1)
	if err != nil || len(ms) != n+1 {
		t.Fatalf("Members = %d, %v; want %d", len(ms), err, n+1)
	}
	if c, err := e.s.Conversation(ctx, 1); err != nil || c.Members != n+1 {
		t.Errorf("Conversation.Members = %d, %v; want %d", c.Members, err, n+1)
	}
	for _, u := range []string{user(5), user(150), user(n - 1)} {
		rows, err := e.s.UserConversations(ctx, u)
		wantRow := store.ConvRow{ConvID: 1, UserID: u, Kind: store.Group, JoinSeq: last + 1, LastSeq: last}
		if err != nil || len(rows) != 1 || rows[0] != wantRow {
			t.Errorf("UserConversations(%s) = %+v, %v; want [%+v]", u, rows, err, wantRow)
		}
	}

	next := e.send(t, 1, "owner", 1)[0].Seq
	var leaving []string
	for i := 0; i < n; i += 2 {
		leaving = append(leaving, user(i))
	}
	left, err := e.s.RemoveMembers(ctx, 1, append(leaving, "nobody", user(0)))
	if err != nil || len(left) != len(leaving) {
		t.Fatalf("RemoveMembers(%d users) = %d, %v; want %d", len(leaving), len(left), err, len(leaving))
	}
	for _, m := range left {
		join := last + 1
		if m.UserID < user(3) {
			join = 1
		}
		want := store.Member{ConvID: 1, UserID: m.UserID, Role: store.RoleMember, JoinSeq: join, LeaveSeq: next}
		if m != want {
			t.Fatalf("RemoveMembers: %+v, want %+v", m, want)
		}
	}
	ms, err = e.s.Members(ctx, 1)
	if err != nil || len(ms) != n-len(leaving)+1 {
		t.Fatalf("Members after the removal = %d, %v; want %d", len(ms), err, n-len(leaving)+1)
	}
	if slices.ContainsFunc(ms, func(m store.Member) bool { return slices.Contains(leaving, m.UserID) }) {
		t.Errorf("a removed user is still listed")
	}
	if c, err := e.s.Conversation(ctx, 1); err != nil || c.Members != n-len(leaving)+1 {
		t.Errorf("Conversation.Members = %d, %v; want %d", c.Members, err, n-len(leaving)+1)
	}
	u := user(150)
	rows, err := e.s.UserConversations(ctx, u)
	wantRow := store.ConvRow{ConvID: 1, UserID: u, Kind: store.Group, JoinSeq: last + 1, LeaveSeq: next, LastSeq: next}
	if err != nil || len(rows) != 1 || rows[0] != wantRow {
		t.Errorf("UserConversations(%s) = %+v, %v; want [%+v]", u, rows, err, wantRow)
	}
}
