package fanout

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/statecache"
)

type rows map[string][]store.ConvRow

func (r rows) UserConversations(_ context.Context, u string) ([]store.ConvRow, error) {
	return r[u], nil
}

func userIDs(ms []store.Member) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.UserID)
	}
	sort.Strings(out)
	return out
}

func TestOnlineIndexFollowsPresenceAndMembership(t *testing.T) {
	r := rows{"a": {{ConvID: 7, JoinSeq: 3}}, "b": {{ConvID: 7, JoinSeq: 1}}}
	o := NewOnline(r)
	ctx := context.Background()
	o.Connected(ctx, "a")
	o.Track(7, []store.Member{{UserID: "a", JoinSeq: 3}, {UserID: "b", JoinSeq: 1}, {UserID: "c", JoinSeq: 1}})
	if got, _ := o.GroupOnline(7); len(got) != 1 || got[0].UserID != "a" || got[0].JoinSeq != 3 || got[0].ConvID != 7 {
		t.Fatalf("online = %+v, want only a with join_seq 3", got)
	}
	o.Connected(ctx, "b") // comes online: indexed from its rows
	o.Joined(7, []store.Member{{UserID: "d", JoinSeq: 9}})
	if got, _ := o.GroupOnline(7); fmt.Sprint(userIDs(got)) != "[a b]" {
		t.Fatalf("online = %+v, want a and b (d is offline)", got)
	}
	o.Left(7, []string{"a"})
	o.Disconnected("b")
	if got, _ := o.GroupOnline(7); len(got) != 0 {
		t.Fatalf("online = %+v, want none", got)
	}
	if _, ok := o.GroupOnline(8); ok {
		t.Fatal("an untracked group reported as tracked")
	}
	// A second device keeps the user online until both are gone.
	o.Connected(ctx, "b")
	o.Connected(ctx, "b")
	o.Disconnected("b")
	if got, _ := o.GroupOnline(7); fmt.Sprint(userIDs(got)) != "[b]" || !o.Online("b") {
		t.Fatalf("online = %+v with one of two devices gone, want b", got)
	}
	o.Disconnected("b")
	if got, _ := o.GroupOnline(7); len(got) != 0 || o.Online("b") {
		t.Fatalf("online = %+v after both devices left, want none", got)
	}
	o.Untrack(7)
	if o.Tracked(7) {
		t.Fatal("untracked group still tracked")
	}
}

// TestGroupOnlineSharesItsSnapshotUntilAChange: sends to a group whose
// online members did not change get the same slice (no copy per send); a
// change gives the next caller a fresh one and leaves the old intact.
func TestGroupOnlineSharesItsSnapshotUntilAChange(t *testing.T) {
	o := NewOnline(rows{})
	ctx := context.Background()
	o.Connected(ctx, "a")
	o.Connected(ctx, "b")
	o.Track(1, []store.Member{{UserID: "a", JoinSeq: 1}, {UserID: "b", JoinSeq: 1}})
	s1, _ := o.GroupOnline(1)
	s2, _ := o.GroupOnline(1)
	if len(s1) != 2 || &s1[0] != &s2[0] {
		t.Fatalf("two reads without a change: %p vs %p, want the same snapshot", &s1[0], &s2[0])
	}
	o.Disconnected("a")
	s3, _ := o.GroupOnline(1)
	if len(s3) != 1 || s3[0].UserID != "b" {
		t.Fatalf("after a disconnect: %+v, want b", s3)
	}
	if fmt.Sprint(userIDs(s1)) != "[a b]" {
		t.Fatalf("the old snapshot changed: %+v", s1)
	}
}

// TestDisconnectTouchesOnlyTheUsersGroups: a user is recorded in the
// groups it is indexed in, and a disconnect removes it from those; the
// other groups are left alone (and are never visited).
func TestDisconnectTouchesOnlyTheUsersGroups(t *testing.T) {
	o := NewOnline(rows{})
	ctx := context.Background()
	o.Connected(ctx, "u")
	o.Connected(ctx, "v")
	for conv := uint64(1); conv <= 100; conv++ {
		members := []store.Member{{UserID: "v", JoinSeq: 1}}
		if conv%10 == 0 {
			members = append(members, store.Member{UserID: "u", JoinSeq: 1})
		}
		o.Track(conv, members)
	}
	us := o.userShard("u")
	us.mu.Lock()
	n := len(us.m["u"].groups)
	us.mu.Unlock()
	if n != 10 {
		t.Fatalf("u is recorded in %d groups, want 10", n)
	}
	o.Disconnected("u")
	for conv := uint64(1); conv <= 100; conv++ {
		got, _ := o.GroupOnline(conv)
		if fmt.Sprint(userIDs(got)) != "[v]" {
			t.Fatalf("group %d: %+v, want only v", conv, got)
		}
	}
}

// TestOnlineIndexConcurrentChurn: connects, disconnects, tracks, joins
// and leaves from many goroutines while sends read the index; at the end
// every group holds exactly its online, current members. Run with -race.
func TestOnlineIndexConcurrentChurn(t *testing.T) {
	const users, groups = 200, 20
	r := rows{}
	member := func(u, g int) bool { return (u+g)%3 == 0 }
	for u := range users {
		for g := range groups {
			if member(u, g) {
				r[fmt.Sprint("u", u)] = append(r[fmt.Sprint("u", u)], store.ConvRow{ConvID: uint64(g + 1), JoinSeq: 1})
			}
		}
	}
	o := NewOnline(r)
	ctx := context.Background()
	var wg sync.WaitGroup
	// Users connect and disconnect; even users end online, odd offline.
	for u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprint("u", u)
			for range 20 {
				o.Connected(ctx, name)
				o.Disconnected(name)
			}
			if u%2 == 0 {
				o.Connected(ctx, name)
			}
		}()
	}
	for g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ms []store.Member
			for u := range users {
				if member(u, g) {
					ms = append(ms, store.Member{UserID: fmt.Sprint("u", u), JoinSeq: 1})
				}
			}
			o.Track(uint64(g+1), ms)
			for range 50 {
				if got, ok := o.GroupOnline(uint64(g + 1)); ok {
					for _, m := range got {
						_ = m.UserID
					}
				}
			}
		}()
	}
	wg.Wait()
	for g := range groups {
		var want []string
		for u := range users {
			if member(u, g) && u%2 == 0 {
				want = append(want, fmt.Sprint("u", u))
			}
		}
		sort.Strings(want)
		got, ok := o.GroupOnline(uint64(g + 1))
		if !ok || fmt.Sprint(userIDs(got)) != fmt.Sprint(want) {
			t.Fatalf("group %d: %v, want %v", g+1, userIDs(got), want)
		}
	}
}

// TestScopedRebuildsAfterOwnershipMoves: an entry built under one
// ownership epoch is not trusted under another (memberships may have
// changed on the other owner, whose relay event may be lost), nor on a
// process that does not own the conversation; an entry built under the
// current epoch is.
func TestScopedRebuildsAfterOwnershipMoves(t *testing.T) {
	ctx := context.Background()
	o := NewOnline(rows{})
	var (
		epoch uint64 = 5
		owned        = true
	)
	s := NewScoped(o, func(uint64) (uint64, bool) { return epoch, owned })
	o.Connected(ctx, "a")
	o.Connected(ctx, "b")
	s.Track(7, []store.Member{{UserID: "a", JoinSeq: 1}, {UserID: "b", JoinSeq: 1}})
	if !s.Tracked(7) {
		t.Fatal("an entry built under the current epoch is not trusted")
	}
	// The partition moves away and back; meanwhile b left on the other
	// owner and its event never arrived here.
	epoch = 9
	if s.Tracked(7) {
		t.Fatal("an entry built under epoch 5 is trusted under epoch 9")
	}
	if _, ok := s.GroupOnline(7); ok {
		t.Fatal("the stale entry was kept")
	}
	s.Track(7, []store.Member{{UserID: "a", JoinSeq: 1}}) // read again from the store
	if got, ok := s.GroupOnline(7); !ok || fmt.Sprint(userIDs(got)) != "[a]" || !s.Tracked(7) {
		t.Fatalf("rebuilt entry = %+v, %v; want only a, trusted", got, ok)
	}
	// Not the owner (an outbox entry left by another process): never
	// trusted, rebuilt for each use.
	owned = false
	if s.Tracked(7) {
		t.Fatal("an entry is trusted on a process that does not own the conversation")
	}
	s.Track(7, []store.Member{{UserID: "a", JoinSeq: 1}, {UserID: "b", JoinSeq: 4}})
	if got, ok := s.GroupOnline(7); !ok || fmt.Sprint(userIDs(got)) != "[a b]" {
		t.Fatalf("entry built for one use = %+v, %v; want a and b", got, ok)
	}
	if s.Tracked(7) {
		t.Fatal("an entry built without ownership is trusted on the next use")
	}
}

// TestScopedBounded: a cluster chat process tracks at most the bound's
// worth of groups; the least recently used go, and a group whose entry
// went is rebuilt (Tracked answers false) on its next message.
func TestScopedBounded(t *testing.T) {
	ctx := context.Background()
	o := NewOnline(rows{})
	o.Connected(ctx, "a")
	s := newScoped(o, func(uint64) (uint64, bool) { return 1, true }, statecache.Config{Max: 10, Idle: -1})
	for conv := uint64(1); conv <= 1000; conv++ {
		if s.Tracked(conv) {
			t.Fatalf("group %d tracked before Track", conv)
		}
		s.Track(conv, []store.Member{{UserID: "a", JoinSeq: 1}})
		if !s.Tracked(conv) {
			t.Fatalf("group %d not tracked after Track", conv)
		}
	}
	if n := s.Groups(); n > 10+1 {
		t.Fatalf("%d group records held with a bound of 10", n)
	}
	tracked := 0
	for i := range o.groups {
		tracked += len(o.groups[i].m)
	}
	if tracked > 10+1 {
		t.Fatalf("%d groups indexed with a bound of 10", tracked)
	}
	if s.Tracked(1) {
		t.Fatal("an evicted group is trusted")
	}
	if got, ok := s.GroupOnline(1000); !ok || len(got) != 1 {
		t.Fatalf("the latest group's online members = %v, %v", got, ok)
	}
}
