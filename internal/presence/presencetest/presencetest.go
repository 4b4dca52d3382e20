// Package presencetest is the conformance suite every presence.Directory
// must pass: the embedded one (presence.Local) and cluster mode's
// (internal/cluster/relay, on real Redis and NATS).
package presencetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/protocol"
)

// Deployment is one deployment's presence as two processes see it.
type Deployment struct {
	// A is the directory of the process whose gateway the devices connect
	// to; B another process's (the same as A for an in-memory directory).
	A, B presence.Directory
	// Connect and Disconnect a device of user on A's node as a gateway
	// does (the session registry first, then A.Changed).
	Connect    func(user, device string)
	Disconnect func(user, device string)
	// Kill, if not nil, ends A's node without any disconnect (kill -9 of
	// its gateway); B must then see its users offline.
	Kill func()
}

// Run runs the suite. open returns a fresh deployment whose last seen is
// kept for lastSeenTTL; its directories run until the subtest ends.
func Run(t *testing.T, open func(t *testing.T, lastSeenTTL time.Duration) Deployment) {
	ctx := context.Background()
	t.Run("OnlineOffline", func(t *testing.T) {
		d := open(t, time.Hour)
		u := unique("u")
		d.Connect(u, "phone")
		d.Connect(u, "laptop")
		if st := states(t, d.B, u, "never"); !st[u].Online || st["never"] != (presence.State{}) {
			t.Fatalf("states = %+v, want %s online and never-seen offline without last seen", st, u)
		}
		d.Disconnect(u, "phone")
		if st := states(t, d.B, u); !st[u].Online {
			t.Fatalf("one device left: %+v, want online", st)
		}
		before := time.Now().UnixMilli()
		d.Disconnect(u, "laptop")
		after := time.Now().UnixMilli()
		st := states(t, d.B, u)[u]
		if st.Online || st.LastSeen < before || st.LastSeen > after {
			t.Fatalf("after the last device: %+v, want offline with last seen in [%d, %d]", st, before, after)
		}
	})
	t.Run("FollowersHearChanges", func(t *testing.T) {
		d := open(t, time.Hour)
		h := &heard{}
		d.B.Listen(h.listen)
		u, v, w := unique("u"), unique("v"), unique("w")
		d.B.Follow([]string{u, w})
		d.Connect(v, "d") // not followed
		d.Connect(u, "d")
		eventually(t, "B hears u's connect", func() bool { return h.count(u) > 0 })
		d.B.Unfollow([]string{u})
		n := h.count(u)
		d.Disconnect(u, "d")
		d.Connect(w, "d") // sent after u's disconnect
		eventually(t, "B hears w's connect", func() bool { return h.count(w) > 0 })
		time.Sleep(200 * time.Millisecond)
		if h.count(v) > 0 {
			t.Fatal("B heard a user it does not follow")
		}
		if h.count(u) != n {
			t.Fatal("B heard a user it no longer follows")
		}
		// Two interests: one Unfollow keeps the other.
		d.B.Follow([]string{v})
		d.B.Follow([]string{v})
		d.B.Unfollow([]string{v})
		d.Disconnect(v, "d")
		eventually(t, "B hears v with one interest left", func() bool { return h.count(v) > 0 })
	})
	t.Run("TrackerPushes", func(t *testing.T) {
		d := open(t, time.Hour)
		tr := presence.NewWith(presence.Config{Flush: 20 * time.Millisecond, MinGap: time.Millisecond}, d.B, nil)
		run(t, tr.Run)
		u := unique("u")
		s := &sink{}
		got, err := tr.Watch(ctx, s, []string{u})
		if err != nil || len(got) != 1 || got[0].Online {
			t.Fatalf("Watch = %+v, %v; want %s offline", got, err, u)
		}
		d.Connect(u, "d")
		eventually(t, "an online push", func() bool { return s.last(u) != nil && s.last(u).Online })
		d.Disconnect(u, "d")
		eventually(t, "an offline push with last seen", func() bool {
			st := s.last(u)
			return st != nil && !st.Online && st.LastSeen > 0
		})
		if tr.Watched() != 1 {
			t.Fatalf("tracker watches %d users, want 1", tr.Watched())
		}
		tr.Unwatch(s)
		if tr.Watched() != 0 || tr.Remembered() != 0 && isRemote(d) {
			t.Fatalf("after Unwatch the tracker holds %d watched, %d remembered", tr.Watched(), tr.Remembered())
		}
	})
	t.Run("LastSeenExpires", func(t *testing.T) {
		d := open(t, time.Second)
		u := unique("u")
		d.Connect(u, "d")
		d.Disconnect(u, "d")
		if st := states(t, d.B, u)[u]; st.LastSeen == 0 {
			t.Fatalf("within the TTL: %+v, want a last seen", st)
		}
		eventually(t, "last seen forgotten after its TTL", func() bool { return states(t, d.B, u)[u] == presence.State{} })
	})
	t.Run("KilledNodesUsersGoOffline", func(t *testing.T) {
		d := open(t, time.Hour)
		if d.Kill == nil {
			t.Skip("every device of this directory is in its own process")
		}
		tr := presence.NewWith(presence.Config{Flush: 20 * time.Millisecond, MinGap: time.Millisecond}, d.B, nil)
		run(t, tr.Run)
		u := unique("u")
		s := &sink{}
		d.Connect(u, "d")
		if got, err := tr.Watch(ctx, s, []string{u}); err != nil || !got[0].Online {
			t.Fatalf("Watch = %+v, %v; want online", got, err)
		}
		start := time.Now()
		d.Kill()
		eventually(t, "an offline push after the node died", func() bool { st := s.last(u); return st != nil && !st.Online })
		t.Logf("offline seen %v after the kill", time.Since(start).Round(time.Millisecond))
		// The dead node could not record a last seen: the process that
		// found its devices gone did, no earlier than the kill.
		if st := s.last(u); st.LastSeen < start.UnixMilli() {
			t.Fatalf("last seen of a killed node's user = %d, want ≥ the kill (%d)", st.LastSeen, start.UnixMilli())
		}
	})
}

func isRemote(d Deployment) bool { return d.A != d.B }

func states(t *testing.T, d presence.Directory, users ...string) map[string]presence.State {
	t.Helper()
	st, err := d.States(context.Background(), users)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

var (
	seqMu sync.Mutex
	seq   int
)

// unique returns a user id no other subtest uses.
func unique(p string) string {
	seqMu.Lock()
	defer seqMu.Unlock()
	seq++
	return fmt.Sprintf("%s%d-%d", p, seq, time.Now().UnixNano())
}

type heard struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *heard) listen(scope presence.Scope, users []string) {
	if scope != presence.Users {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = make(map[string]int)
	}
	for _, u := range users {
		h.n[u]++
	}
}

func (h *heard) count(u string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[u]
}

type sink struct {
	mu     sync.Mutex
	states []protocol.PresenceState
}

func (s *sink) Presence(st []protocol.PresenceState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.states = append(s.states, st...)
}

func (s *sink) last(u string) *protocol.PresenceState {
	s.mu.Lock()
	defer s.mu.Unlock()
	for j := len(s.states) - 1; j >= 0; j-- {
		if s.states[j].UserID == u {
			st := s.states[j]
			return &st
		}
	}
	return nil
}

func run(t *testing.T, f func(context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// eventually waits (generously: the machine is shared) for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached in 90 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
