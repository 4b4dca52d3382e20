package statecache

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type state struct {
	Node
	id   uint64
	busy atomic.Bool // not quiescent
}

func newCache(cfg Config) *Cache[state, *state] {
	return New[state](cfg, func(s *state) bool { return !s.busy.Load() })
}

func TestBoundedLRU(t *testing.T) {
	c := newCache(Config{Max: 3, Idle: -1})
	for i := uint64(1); i <= 10; i++ {
		s := c.GetOrCreate(i, func(s *state) { s.id = i })
		if s.id != i {
			t.Fatalf("GetOrCreate(%d) returned state %d", i, s.id)
		}
		c.Release(s)
	}
	// The new state is pinned while trim runs, so one extra may stay
	// until the next call.
	if n := c.Len(); n > 4 {
		t.Fatalf("Len = %d after 10 states with Max 3", n)
	}
	if c.Peek(1) != nil || c.Peek(10) == nil {
		t.Fatalf("the oldest state stayed or the newest went")
	}
	if c.Evicted() < 6 {
		t.Fatalf("Evicted = %d, want ≥ 6", c.Evicted())
	}
}

func TestPinnedAndBusyStay(t *testing.T) {
	c := newCache(Config{Max: 1, Idle: -1})
	held := c.GetOrCreate(1, nil) // pinned throughout
	busy := c.GetOrCreate(2, nil)
	busy.busy.Store(true)
	c.Release(busy)
	for i := uint64(3); i <= 50; i++ {
		c.Release(c.GetOrCreate(i, nil))
	}
	if c.Peek(1) != held {
		t.Fatal("a pinned state was evicted")
	}
	if c.Peek(2) != busy {
		t.Fatal("a state the store did not let go was evicted")
	}
	if got := c.Get(1); got != held {
		t.Fatal("Get returned another state than the pinned one")
	} else {
		c.Release(got)
	}
	c.Release(held)
	busy.busy.Store(false)
	if n := c.EvictIdle(); n < 2 {
		t.Fatalf("EvictIdle evicted %d, want the two released states", n)
	}
	if c.Len() != 0 {
		t.Fatalf("Len = %d after EvictIdle with nothing pinned", c.Len())
	}
	if c.Get(1) != nil {
		t.Fatal("Get of an evicted state found one")
	}
}

func TestIdle(t *testing.T) {
	c := newCache(Config{Max: 1000, Idle: time.Millisecond})
	for i := uint64(1); i <= 5; i++ {
		c.Release(c.GetOrCreate(i, nil))
	}
	time.Sleep(5 * time.Millisecond)
	c.Release(c.GetOrCreate(100, nil)) // each call evicts up to Scan idle ones
	if c.Len() != 1 || c.Peek(100) == nil {
		t.Fatalf("Len = %d, want only the fresh state after the others idled", c.Len())
	}
}

func TestReleaseWithoutPinPanics(t *testing.T) {
	c := newCache(Config{})
	s := c.GetOrCreate(1, nil)
	c.Release(s)
	defer func() {
		if recover() == nil {
			t.Fatal("a second Release did not panic")
		}
	}()
	c.Release(s)
}

// TestConcurrentOneStatePerKey checks the invariant the stores rely on:
// while a state is pinned, every GetOrCreate of its key returns that same
// state, however hard eviction runs.
func TestConcurrentOneStatePerKey(t *testing.T) {
	c := newCache(Config{Max: 4, Idle: -1, Scan: 4})
	var (
		wg   sync.WaitGroup
		live [16]atomic.Pointer[state]
		bad  atomic.Int32
	)
	for w := range 8 {
		wg.Go(func() {
			for i := range 5000 {
				k := uint64((w*7 + i) % len(live))
				s := c.GetOrCreate(k, nil)
				if prev := live[k].Swap(s); prev != nil && prev != s {
					bad.Add(1) // two states pinned for one key
				}
				live[k].CompareAndSwap(s, nil)
				c.Release(s)
			}
		})
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d times two live states for one key", bad.Load())
	}
}
