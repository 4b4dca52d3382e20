package snowflake

import (
	"sync"
	"testing"
	"time"
)

func TestMonotonicAcrossClockStepBack(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := base
	g := New(7, func() time.Time { return clock })
	var last uint64
	for i := 0; i < 10000; i++ {
		if i == 5000 {
			clock = base.Add(-time.Hour) // wall clock steps back
		}
		id := g.Next()
		if id <= last {
			t.Fatalf("id %d after %d: not increasing", id, last)
		}
		last = id
	}
	if got := Time(last); got < base.UnixMilli() {
		t.Fatalf("Time(last) = %d, want ≥ %d", got, base.UnixMilli())
	}
}

func TestUniqueConcurrent(t *testing.T) {
	g := New(1, nil)
	const workers, each = 8, 5000
	ids := make(chan uint64, workers*each)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				ids <- g.Next()
			}
		}()
	}
	wg.Wait()
	close(ids)
	seen := make(map[uint64]bool, workers*each)
	for id := range ids {
		if seen[id] {
			t.Fatalf("duplicate id %d", id)
		}
		seen[id] = true
	}
}

func TestTimeRoundTrip(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	g := New(1023, func() time.Time { return now })
	if got, want := Time(g.Next()), now.UnixMilli(); got != want {
		t.Fatalf("Time = %d, want %d", got, want)
	}
}
