package relay

import (
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"

	"github.com/parley-im/parley/internal/presence"
)

// TestDropsHiddenByUnfollowAreHeard: hints a slow handler made the client
// drop on one shard's subscription are noticed (everyone followed is read
// again) even when, between two checks, another shard's subscription that
// had dropped more hints earlier is removed by an Unfollow. Summing the
// current subscriptions' counts saw no rise there and missed them.
func TestDropsHiddenByUnfollowAreHeard(t *testing.T) {
	const shards = 16
	ns := namespace()
	r := New(connect(t), nil, nil, nil, Config{Namespace: ns, Node: "chat", Shards: shards, Resync: time.Hour, Logger: quiet})
	ticks := make(chan time.Time)
	r.ticks = ticks

	// Two users on different shards.
	ua, ub := "a0", ""
	for i := 1; ub == ""; i++ {
		if u := "b" + strconv.Itoa(i); ShardOf(u, shards) != ShardOf(ua, shards) {
			ub = u
		}
	}
	shA, shB := ShardOf(ua, shards), ShardOf(ub, shards)

	// The listener holds every hint's handler until the test ends, so the
	// client queues the next hint of that shard and drops the rest.
	release := make(chan struct{})
	var everyone atomic.Int32
	r.Listen(func(scope presence.Scope, users []string) {
		switch scope {
		case presence.Everyone:
			everyone.Add(1)
		case presence.Users:
			<-release
		}
	})
	r.Follow([]string{ua, ub})
	r.mu.Lock()
	subA, subB := r.mu.subs[shA], r.mu.subs[shB]
	r.mu.Unlock()
	for _, s := range []*natsio.Subscription{subA, subB} {
		if err := s.SetPendingLimits(1, 1<<20); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	defer func() {
		close(release)
		cancel()
		if err := <-ran; err != nil {
			t.Error(err)
		}
	}()
	// check has Run check once: the second tick is taken only once the
	// first one's check is over.
	check := func() {
		ticks <- time.Now()
		ticks <- time.Now()
	}

	pub := connect(t)
	// burst sends n hints of user to its shard and waits until the client
	// has handed each to the held handler, queued or dropped it (the limit
	// of one pending hint, the held one, drops every later hint); it
	// returns the drops.
	burst := func(sub *natsio.Subscription, user string, n int) int {
		t.Helper()
		data, _ := json.Marshal(hint{User: user, Online: true})
		for range n {
			if err := pub.Publish(subjectShard(ns, ShardOf(user, shards)), data); err != nil {
				t.Fatal(err)
			}
		}
		if err := pub.Flush(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			// The pending count includes the hint in the held handler.
			dropped, _ := sub.Dropped()
			pending, _, _ := sub.Pending()
			if pending+dropped == n {
				return dropped
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d pending, %d dropped of %d hints", user, pending, dropped, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	check()
	if n := everyone.Load(); n != 0 {
		t.Fatalf("%d rereads of everyone before any drop", n)
	}
	dropsA := burst(subA, ua, 20)
	check()
	if n := everyone.Load(); n != 1 {
		t.Fatalf("%d drops on %s's shard: %d rereads of everyone, want 1", dropsA, ua, n)
	}
	check()
	if n := everyone.Load(); n != 1 {
		t.Fatalf("no new drop: %d rereads of everyone, want still 1", n)
	}
	// Fewer drops on B's shard, and A's subscription goes in the same
	// interval.
	dropsB := burst(subB, ub, 3)
	if dropsB == 0 || dropsB >= dropsA {
		t.Fatalf("drops: %d on A, %d on B; the test needs 0 < B < A", dropsA, dropsB)
	}
	r.Unfollow([]string{ua})
	if _, shardsOn := r.Followed(); shardsOn != 1 {
		t.Fatalf("%d shard subscriptions after unfollowing %s, want 1", shardsOn, ua)
	}
	check()
	if n := everyone.Load(); n != 2 {
		t.Fatalf("%d new drops on %s's shard while %s's shard (%d drops) was unsubscribed: %d rereads of everyone, want 2", dropsB, ub, ua, dropsA, n)
	}
}
