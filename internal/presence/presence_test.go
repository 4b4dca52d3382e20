package presence

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

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
	tr := New(Config{Flush: time.Second, MinGap: 5 * time.Second}, func() time.Time { return now })
	w := &sink{}
	if st := watch(t, tr, w, "bob"); len(st) != 1 || st[0].Online {
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

// TestLastSeenForgotten: a user's last seen is answered for LastSeenTTL
// and then forgotten, and a tracker that sees many distinct users go
// offline over time holds only the recent ones.
func TestLastSeenForgotten(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	tr := New(Config{LastSeenTTL: time.Minute}, func() time.Time { return now })
	ctx := context.Background()
	tr.Connected(ctx, "bob")
	tr.Disconnected("bob")
	gone := now.UnixMilli()
	w := &sink{}
	now = now.Add(59 * time.Second)
	if st := watch(t, tr, w, "bob"); st[0].LastSeen != gone {
		t.Fatalf("last seen within the TTL = %d, want %d", st[0].LastSeen, gone)
	}
	now = now.Add(time.Second)
	if st := watch(t, tr, w, "bob"); st[0].LastSeen != 0 {
		t.Fatalf("last seen after the TTL = %d, want 0 (forgotten)", st[0].LastSeen)
	}
	tr.Unwatch(w)

	// 100,000 distinct users, 10 per second, each online for a moment.
	peak := 0
	for i := range 100_000 {
		now = now.Add(100 * time.Millisecond)
		u := fmt.Sprint("u", i)
		tr.Connected(ctx, u)
		tr.Disconnected(u)
		if i%100 == 0 {
			tr.Flush()
		}
		peak = max(peak, tr.Remembered())
	}
	if limit := 2*60*10 + 10; peak > limit {
		t.Fatalf("tracker remembered up to %d users at 10 offline/s with a 1 min TTL; want ≤ %d", peak, limit)
	}
}

func watch(t *testing.T, tr *Tracker, s Subscriber, users ...string) []protocol.PresenceState {
	t.Helper()
	st, err := tr.Watch(context.Background(), s, users)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
