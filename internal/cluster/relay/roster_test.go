package relay

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func runRoster(t testing.TB, r *fanout.Roster) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func onlineOf(r *fanout.Roster, conv uint64) []string {
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

func members(conv uint64, users ...string) []store.Member {
	out := make([]store.Member, len(users))
	for i, u := range users {
		out[i] = store.Member{ConvID: conv, UserID: u, JoinSeq: uint64(i + 1)}
	}
	return out
}

// TestRosterFollowsGroupMembers: a chat process's online index built from
// the registry when a group is tracked, kept current by the hints of its
// members on two gateways (a member's second device, a leave, a join), and
// emptied of a killed gateway's users by the periodic reread.
func TestRosterFollowsGroupMembers(t *testing.T) {
	c := newCluster(t, time.Hour)
	g1, g2 := c.gateway("gw-1"), c.gateway("gw-2")
	chat := c.process("chat", c.registry(), nil)
	r := fanout.NewRoster(chat, quiet)
	runRoster(t, r)
	g1.connect(t, "ann", "d")
	g2.connect(t, "bob", "d")
	g2.connect(t, "zed", "d") // not a member
	r.Track(7, members(7, "ann", "bob", "cat"))
	if got := onlineOf(r, 7); !slices.Equal(got, []string{"ann", "bob"}) {
		t.Fatalf("online after Track = %v, want [ann bob]", got)
	}
	g1.connect(t, "cat", "d")
	eventually(t, "cat online", func() bool { return slices.Equal(onlineOf(r, 7), []string{"ann", "bob", "cat"}) })
	g2.connect(t, "ann", "d2") // a second device
	g1.disconnect(t, "ann", "d")
	time.Sleep(300 * time.Millisecond)
	if got := onlineOf(r, 7); !slices.Contains(got, "ann") {
		t.Fatalf("ann with a device left is offline: %v", got)
	}
	r.Left(7, []string{"bob"})
	r.Joined(7, []store.Member{{ConvID: 7, UserID: "zed", JoinSeq: 9}})
	if got := onlineOf(r, 7); !slices.Equal(got, []string{"ann", "cat", "zed"}) {
		t.Fatalf("online after bob left and zed joined = %v, want [ann cat zed]", got)
	}
	if users, _ := chat.Followed(); users != 3 {
		t.Fatalf("the chat process follows %d users, want the 3 members", users)
	}
	g2.kill() // ann's second device and zed's
	eventually(t, "gw-2's users offline", func() bool { return slices.Equal(onlineOf(r, 7), []string{"cat"}) })
	r.Untrack(7)
	if users, shards := chat.Followed(); users != 0 || shards != 0 {
		t.Fatalf("after Untrack: %d users followed on %d shards, want none", users, shards)
	}
}

// TestMemoryFollowsWhatItServes: with many users online on other
// gateways, a process holds presence state only for what it serves — a
// gateway for the users its connections watch, a chat process for the
// members of its tracked groups — not for the cluster's online users.
// PARLEY_PRESENCE_ONLINE sets how many are online (default 5,000).
func TestMemoryFollowsWhatItServes(t *testing.T) {
	online := envInt("PARLEY_PRESENCE_ONLINE", 5000)
	c := newCluster(t, time.Hour)
	gws := []*gateway{c.gateway("gw-1"), c.gateway("gw-2"), c.gateway("gw-3")}
	watcher := c.process("gw-4", c.registry(), nil)
	tr := presence.NewWith(presence.Config{Flush: 20 * time.Millisecond, MinGap: time.Millisecond}, watcher, nil)
	chat := c.process("chat", c.registry(), nil)
	r := fanout.NewRoster(chat, quiet)
	runRoster(t, r)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tr.Run(ctx)

	user := func(i int) string { return fmt.Sprintf("u%07d", i) }
	// The observers' load: 50 watched users, two groups of 500 members.
	var watched []string
	for i := range 50 {
		watched = append(watched, user(i*97%online))
	}
	s := &sinkT{}
	if _, err := tr.Watch(ctx, s, watched); err != nil {
		t.Fatal(err)
	}
	var g1, g2 []string
	for i := range 500 {
		g1 = append(g1, user(i*13%online))
		g2 = append(g2, user((i*13+7)%online))
	}
	r.Track(1, members(1, g1...))
	r.Track(2, members(2, g2...))
	heapBefore := heap()
	start := time.Now()
	for i := range online {
		gws[i%3].register(t, user(i), "d")
	}
	t.Logf("%d users online on 3 gateways in %v", online, time.Since(start).Round(time.Millisecond))
	inGroup := func(conv uint64, want int) func() bool {
		return func() bool { ms, _ := r.GroupOnline(conv); return len(ms) == want }
	}
	eventually(t, "group 1 all online", inGroup(1, countDistinct(g1)))
	eventually(t, "group 2 all online", inGroup(2, countDistinct(g2)))
	heapAfter := heap()
	wu, wsh := watcher.Followed()
	cu, csh := chat.Followed()
	ru, rg := r.Size()
	t.Logf("online elsewhere: %d; gateway: %d watched users followed on %d shards; chat: roster %d users / %d groups, %d followed on %d shards; heap %.1f → %.1f MiB",
		online, wu, wsh, ru, rg, cu, csh, float64(heapBefore)/(1<<20), float64(heapAfter)/(1<<20))
	if wu != countDistinct(watched) || tr.Watched() != countDistinct(watched) {
		t.Fatalf("the watching gateway follows %d users, watches %d; want the %d watched", wu, tr.Watched(), countDistinct(watched))
	}
	if want := countDistinct(append(slices.Clone(g1), g2...)); ru != want || cu != want {
		t.Fatalf("the chat process holds %d users and follows %d; want the %d members of its groups", ru, cu, want)
	}
}

type sinkT struct{}

func (sinkT) Presence([]protocol.PresenceState) {}

func countDistinct(users []string) int {
	return len(slices.Compact(slices.Sorted(slices.Values(users))))
}

func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// eventually waits (generously: the machine is shared) for cond.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached in 90 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestResyncReadsOnlyADeadGatewaysUsers: the periodic check reads the
// gateways' leases, and only the followed users of a gateway that died
// are told to be read again — not everyone followed.
func TestResyncReadsOnlyADeadGatewaysUsers(t *testing.T) {
	c := newCluster(t, time.Hour)
	g1, g2 := c.gateway("gw-1"), c.gateway("gw-2")
	obs := c.process("obs", c.registry(), nil)
	var mu sync.Mutex
	told := map[string]int{}
	var wide []presence.Scope
	obs.Listen(func(s presence.Scope, users []string) {
		mu.Lock()
		defer mu.Unlock()
		if s != presence.Users {
			wide = append(wide, s)
		}
		for _, u := range users {
			told[u]++
		}
	})
	for i := range 20 {
		g1.connect(t, fmt.Sprint("a", i), "d")
		g2.connect(t, fmt.Sprint("b", i), "d")
	}
	var all []string
	for i := range 20 {
		all = append(all, fmt.Sprint("a", i), fmt.Sprint("b", i))
	}
	obs.Follow(all)
	if _, err := obs.States(context.Background(), all); err != nil { // places them
		t.Fatal(err)
	}
	time.Sleep(time.Second) // a few resyncs: nothing to tell
	mu.Lock()
	clear(told)
	mu.Unlock()
	g2.kill()
	eventually(t, "gw-2's users told", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return told["b0"] > 0
	})
	time.Sleep(time.Second)
	mu.Lock()
	defer mu.Unlock()
	for u, n := range told {
		if u[0] != 'b' {
			t.Fatalf("%s (on the live gateway) was told %d times after the other died: %v", u, n, told)
		}
	}
	if len(told) != 20 || len(wide) > 0 {
		t.Fatalf("told %d users (want gw-2's 20), wide notifications %v (want none)", len(told), wide)
	}
}

// TestRestartedGatewayAnnouncesDropped: a gateway started under the name
// of one that died clears its predecessor's entries and announces those
// users offline, with a last seen: a watcher hears it at once instead of
// at a lease check.
func TestRestartedGatewayAnnouncesDropped(t *testing.T) {
	c := newCluster(t, time.Hour)
	old := c.gateway("gw-1")
	watcher := c.process("gw-2", c.registry(), nil)
	tr := presence.NewWith(presence.Config{Flush: 20 * time.Millisecond, MinGap: time.Millisecond}, watcher, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tr.Run(ctx)
	old.connect(t, "ann", "d")
	s := &lastSink{}
	if st, err := tr.Watch(ctx, s, []string{"ann"}); err != nil || !st[0].Online {
		t.Fatalf("Watch = %+v, %v; want ann online", st, err)
	}
	old.kill()
	restarted := time.Now().UnixMilli()
	reg := c.registry()
	users, err := reg.DropNodeUsers(ctx, "gw-1")
	if err != nil || !slices.Equal(users, []string{"ann"}) {
		t.Fatalf("DropNodeUsers = %v, %v; want [ann]", users, err)
	}
	c.process("gw-1", reg, nil).Gone(ctx, users)
	eventually(t, "ann offline with a last seen", func() bool {
		st := s.last()
		return st != nil && !st.Online && st.LastSeen >= restarted
	})
}

type lastSink struct {
	mu sync.Mutex
	st *protocol.PresenceState
}

func (l *lastSink) Presence(states []protocol.PresenceState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := states[len(states)-1]
	l.st = &st
}

func (l *lastSink) last() *protocol.PresenceState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}
