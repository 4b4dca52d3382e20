package redis

import (
	"math"
	"sync"
	"testing"
)

func TestCounter(t *testing.T) {
	c := testClient(t)
	cnt, err := NewCounter(c, testPrefix(t, c), "seq")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("NextStartsAtOne", func(t *testing.T) {
		for want := uint64(1); want <= 3; want++ {
			if got, err := cnt.Next(ctx, 1); err != nil || got != want {
				t.Fatalf("Next = %d, %v, want %d", got, err, want)
			}
		}
		if got, _ := cnt.Get(ctx, 2); got != 0 {
			t.Fatalf("Get of an unused counter = %d, want 0", got)
		}
	})
	t.Run("SetOnlyRaises", func(t *testing.T) {
		for _, tc := range []struct{ set, want uint64 }{{10, 10}, {4, 10}, {11, 11}, {11, 11}} {
			if got, err := cnt.Set(ctx, 3, tc.set); err != nil || got != tc.want {
				t.Fatalf("Set(%d) = %d, %v, want %d", tc.set, got, err, tc.want)
			}
		}
		if got, _ := cnt.Next(ctx, 3); got != 12 {
			t.Fatalf("Next after Set(11) = %d, want 12", got)
		}
	})
	t.Run("ExactBeyondFloat", func(t *testing.T) {
		big := uint64(1)<<53 + 1 // not representable as a double
		if got, err := cnt.Set(ctx, 4, big); err != nil || got != big {
			t.Fatalf("Set(2^53+1) = %d, %v", got, err)
		}
		if got, _ := cnt.Set(ctx, 4, big-1); got != big {
			t.Fatalf("Set(2^53) after 2^53+1 = %d, want %d", got, big)
		}
		if got, _ := cnt.Set(ctx, 4, math.MaxInt64); got != math.MaxInt64 {
			t.Fatalf("Set(MaxInt64) = %d", got)
		}
		if _, err := cnt.Set(ctx, 4, math.MaxInt64+1); err == nil {
			t.Fatal("Set beyond MaxInt64 succeeded")
		}
	})
	t.Run("ConcurrentNextIsUnique", func(t *testing.T) {
		var mu sync.Mutex
		seen := make(map[uint64]bool)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 100 {
					v, err := cnt.Next(ctx, 5)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					seen[v] = true
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(seen) != 800 || !seen[1] || !seen[800] {
			t.Fatalf("%d distinct values, want 1..800", len(seen))
		}
	})
	t.Run("NamesAreSeparate", func(t *testing.T) {
		unread, _ := NewCounter(c, cnt.prefix[:len(cnt.prefix)-len("seq:")], "unread")
		if got, _ := unread.Next(ctx, 1); got != 1 {
			t.Fatalf("unread Next = %d, want 1 (seq of conv 1 is separate)", got)
		}
	})
}
