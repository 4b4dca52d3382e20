package presence

import (
	"context"
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
