package presence

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

type rows map[string][]store.ConvRow

func (r rows) UserConversations(_ context.Context, u string) ([]store.ConvRow, error) {
	return r[u], nil
}

type sink struct {
	mu      sync.Mutex
	batches [][]protocol.PresenceState
}

func (s *sink) Presence(st []protocol.PresenceState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, st)
}

func TestFlushAggregatesAndRateLimits(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	tr := New(Config{Flush: time.Second, MinGap: 5 * time.Second}, rows{}, func() time.Time { return now })
	w := &sink{}
	if st := tr.Watch(w, []string{"bob"}); len(st) != 1 || st[0].Online {
		t.Fatalf("initial state = %+v, want bob offline", st)
	}
	ctx := context.Background()
	tr.Connected(ctx, "bob")
	tr.Flush()
	if len(w.batches) != 1 || !w.batches[0][0].Online {
		t.Fatalf("batches = %+v, want one saying bob is online", w.batches)
	}
	// Flapping within MinGap: nothing goes out, the final state is kept.
	for i := 0; i < 10; i++ {
		tr.Disconnected("bob")
		tr.Connected(ctx, "bob")
		now = now.Add(100 * time.Millisecond)
		tr.Flush()
	}
	tr.Disconnected("bob")
	tr.Flush()
	if len(w.batches) != 1 {
		t.Fatalf("%d batches during the gap, want still 1", len(w.batches))
	}
	now = now.Add(5 * time.Second)
	tr.Flush()
	if len(w.batches) != 2 || w.batches[1][0].Online || w.batches[1][0].LastSeen == 0 {
		t.Fatalf("after the gap got %+v, want bob offline with last_seen", w.batches)
	}
	tr.Unwatch(w)
	tr.Connected(ctx, "bob")
	now = now.Add(10 * time.Second)
	tr.Flush()
	if len(w.batches) != 2 {
		t.Fatal("an unwatched user's change was delivered")
	}
}

func TestGroupIndexFollowsPresenceAndMembership(t *testing.T) {
	r := rows{"a": {{ConvID: 7, JoinSeq: 3}}, "b": {{ConvID: 7, JoinSeq: 1}}}
	tr := New(Config{}, r, nil)
	ctx := context.Background()
	tr.Connected(ctx, "a")
	tr.Track(7, []store.Member{{UserID: "a", JoinSeq: 3}, {UserID: "b", JoinSeq: 1}, {UserID: "c", JoinSeq: 1}})
	if got, _ := tr.GroupOnline(7); len(got) != 1 || got[0].UserID != "a" || got[0].JoinSeq != 3 {
		t.Fatalf("online = %+v, want only a with join_seq 3", got)
	}
	tr.Connected(ctx, "b") // comes online: indexed from its rows
	tr.Joined(7, []store.Member{{UserID: "d", JoinSeq: 9}})
	if got, _ := tr.GroupOnline(7); len(got) != 2 {
		t.Fatalf("online = %+v, want a and b (d is offline)", got)
	}
	tr.Left(7, []string{"a"})
	tr.Disconnected("b")
	if got, _ := tr.GroupOnline(7); len(got) != 0 {
		t.Fatalf("online = %+v, want none", got)
	}
	if _, ok := tr.GroupOnline(8); ok {
		t.Fatal("an untracked group reported as tracked")
	}
}
