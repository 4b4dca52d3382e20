package fanout

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/store"
)

func rosterOnline(r *Roster, conv uint64) []string {
	ms, ok := r.GroupOnline(conv)
	if !ok {
		return nil
	}
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.UserID)
	}
	slices.Sort(out)
	return out
}

func startRoster(t *testing.T, dir presence.Directory) *Roster {
	r := NewRoster(dir, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached in 30 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRosterOverLocal: the roster over the in-memory directory: online
// members read at Track, kept current by notifications, joins and leaves,
// and every interest dropped with the group.
func TestRosterOverLocal(t *testing.T) {
	ctx := context.Background()
	dir := presence.NewLocal(time.Hour, nil)
	r := startRoster(t, dir)
	dir.Changed(ctx, "ann", true)
	dir.Changed(ctx, "zed", true)
	r.Track(1, []store.Member{{UserID: "ann", JoinSeq: 1}, {UserID: "bob", JoinSeq: 2}, {UserID: "old", JoinSeq: 1, LeaveSeq: 3}})
	if got := rosterOnline(r, 1); !slices.Equal(got, []string{"ann"}) {
		t.Fatalf("online after Track = %v, want [ann]", got)
	}
	dir.Changed(ctx, "bob", true)
	waitFor(t, "bob online", func() bool { return slices.Equal(rosterOnline(r, 1), []string{"ann", "bob"}) })
	dir.Changed(ctx, "ann", false)
	waitFor(t, "ann offline", func() bool { return slices.Equal(rosterOnline(r, 1), []string{"bob"}) })
	r.Joined(1, []store.Member{{UserID: "zed", JoinSeq: 7}})
	ms, _ := r.GroupOnline(1)
	if i := slices.IndexFunc(ms, func(m store.Member) bool { return m.UserID == "zed" }); i < 0 || ms[i].JoinSeq != 7 {
		t.Fatalf("online after zed joined = %+v, want zed at join_seq 7", ms)
	}
	r.Left(1, []string{"bob"})
	if got := rosterOnline(r, 1); !slices.Equal(got, []string{"zed"}) {
		t.Fatalf("online after bob left = %v, want [zed]", got)
	}
	if users, groups := r.Size(); users != 2 || groups != 1 || dir.Followed() != 2 {
		t.Fatalf("roster holds %d users in %d groups, directory follows %d; want 2 (ann, zed), 1, 2", users, groups, dir.Followed())
	}
	r.Untrack(1)
	if users, groups := r.Size(); users != 0 || groups != 0 || dir.Followed() != 0 {
		t.Fatalf("after Untrack: %d users, %d groups, %d followed; want none", users, groups, dir.Followed())
	}
}

// gated is a directory whose reads can be held, to order a read against
// a notification.
type gated struct {
	*presence.Local
	mu      sync.Mutex
	hold    chan struct{} // when set, States waits on it
	holding chan struct{} // closed when a held read has started
}

func (g *gated) States(ctx context.Context, users []string) (map[string]presence.State, error) {
	g.mu.Lock()
	hold, holding := g.hold, g.holding
	g.hold = nil
	g.mu.Unlock()
	if hold == nil {
		return g.Local.States(ctx, users)
	}
	st, err := g.Local.States(ctx, users) // read before the change below
	close(holding)
	<-hold
	return st, err
}

// TestRosterStaleReadNotApplied: a read that began before a notification
// of its user does not overwrite what the newer read found.
func TestRosterStaleReadNotApplied(t *testing.T) {
	ctx := context.Background()
	g := &gated{Local: presence.NewLocal(time.Hour, nil)}
	r := startRoster(t, g)
	hold, holding := make(chan struct{}), make(chan struct{})
	g.hold, g.holding = hold, holding
	tracked := make(chan struct{})
	go func() { defer close(tracked); r.Track(1, []store.Member{{UserID: "ann", JoinSeq: 1}}) }()
	<-holding // Track's read saw ann offline
	g.Changed(ctx, "ann", true)
	waitFor(t, "the newer read applied", func() bool { return slices.Equal(rosterOnline(r, 1), []string{"ann"}) })
	close(hold) // the stale read (offline) completes
	<-tracked
	if got := rosterOnline(r, 1); !slices.Equal(got, []string{"ann"}) {
		t.Fatalf("online = %v after the stale read returned, want [ann]", got)
	}
}

// TestRosterStaleReadOfAFormerEntry: a read begun for a user the roster
// then forgot (its last group untracked) is not applied to the same user
// tracked again meanwhile: a notification in between reached no entry,
// so the versions alone cannot tell the read is older than the new
// entry's own.
func TestRosterStaleReadOfAFormerEntry(t *testing.T) {
	ctx := context.Background()
	g := &gated{Local: presence.NewLocal(time.Hour, nil)}
	r := startRoster(t, g)
	g.Changed(ctx, "ann", true)
	hold, holding := make(chan struct{}), make(chan struct{})
	g.hold, g.holding = hold, holding
	tracked := make(chan struct{})
	go func() { defer close(tracked); r.Track(1, []store.Member{{UserID: "ann", JoinSeq: 1}}) }()
	<-holding // Track(1)'s read saw ann online
	r.Untrack(1)
	g.Changed(ctx, "ann", false) // told to no entry: ann is not held
	r.Track(2, []store.Member{{UserID: "ann", JoinSeq: 3}})
	if got := rosterOnline(r, 2); len(got) != 0 {
		t.Fatalf("online in 2 = %v after Track, want none", got)
	}
	close(hold) // the stale read (online) completes
	<-tracked
	if got := rosterOnline(r, 2); len(got) != 0 {
		t.Fatalf("online in 2 = %v after the stale read of the former entry returned, want none", got)
	}
}

// TestRosterSendSeesChangesWhole: a send (GroupOnline) racing a change of
// a group's online members sees all of it or none of it: a join or a
// leave of many online members, the read that finds a newly tracked
// group's members online, and an Untrack (the group is gone, or whole).
func TestRosterSendSeesChangesWhole(t *testing.T) {
	ctx := context.Background()
	dir := presence.NewLocal(time.Hour, nil)
	r := startRoster(t, dir)
	names := func(prefix string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = prefix + strconv.Itoa(i)
		}
		return out
	}
	membersOf := func(conv uint64, users []string) []store.Member {
		ms := make([]store.Member, len(users))
		for i, u := range users {
			ms[i] = store.Member{ConvID: conv, UserID: u, JoinSeq: uint64(i + 1)}
		}
		return ms
	}
	base, batch, fresh := names("b", 10), names("j", 100), names("f", 100)
	for _, u := range slices.Concat(base, batch, fresh) {
		dir.Changed(ctx, u, true)
	}
	r.Track(1, membersOf(1, base))
	r.Track(2, membersOf(2, batch)) // held and online: a join adds them at once

	// count returns how many of conv's online members have prefix, -1 if
	// conv is not tracked.
	count := func(conv uint64, prefix string) int {
		ms, ok := r.GroupOnline(conv)
		if !ok {
			return -1
		}
		n := 0
		for _, m := range ms {
			if strings.HasPrefix(m.UserID, prefix) {
				n++
			}
		}
		return n
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Value
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if b, j := count(1, "b"), count(1, "j"); b != 10 || (j != 0 && j != 100) {
					bad.CompareAndSwap(nil, fmt.Sprintf("group 1: %d of 10 base members, %d of the 100 joining ones online; want 10 and 0 or 100", b, j))
				}
				if f := count(3, "f"); f != -1 && f != 0 && f != 100 {
					bad.CompareAndSwap(nil, fmt.Sprintf("group 3: %d of 100 members online while tracked; want 0 or 100", f))
				}
			}
		}()
	}
	for range 200 {
		r.Joined(1, membersOf(1, batch))
		r.Left(1, batch)
		r.Track(3, membersOf(3, fresh))
		r.Untrack(3)
	}
	close(stop)
	wg.Wait()
	if b := bad.Load(); b != nil {
		t.Fatal(b)
	}
	if j, f := count(1, "j"), count(3, "f"); j != 0 || f != -1 {
		t.Fatalf("at the end: %d joined members online in 1, group 3 tracked %v; want 0 and not tracked", j, f != -1)
	}
}
