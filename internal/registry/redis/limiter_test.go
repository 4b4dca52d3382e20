package redis

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	c := testClient(t)
	l := NewLimiter(c, testPrefix(t, c))
	t.Run("BurstThenDeny", func(t *testing.T) {
		for i := range 3 {
			if ok, _, err := l.Allow(ctx, "a", 1, 3); err != nil || !ok {
				t.Fatalf("call %d: ok=%v err=%v, want allowed within the burst", i, ok, err)
			}
		}
		ok, after, err := l.Allow(ctx, "a", 1, 3)
		if err != nil || ok {
			t.Fatalf("4th call: ok=%v err=%v, want denied", ok, err)
		}
		if after <= 0 || after > time.Second {
			t.Fatalf("retryAfter = %s, want in (0, 1s] at 1 token/s", after)
		}
		if ok, _, _ := l.Allow(ctx, "b", 1, 3); !ok {
			t.Fatal("key b denied: buckets must be per key")
		}
	})
	t.Run("RefillsAtRate", func(t *testing.T) {
		ok, _, _ := l.Allow(ctx, "r", 20, 1)
		if !ok {
			t.Fatal("first call denied")
		}
		ok, after, _ := l.Allow(ctx, "r", 20, 1)
		if ok || after <= 0 || after > 50*time.Millisecond {
			t.Fatalf("second call: ok=%v retryAfter=%s, want denied with ≤50ms", ok, after)
		}
		time.Sleep(after + 5*time.Millisecond)
		if ok, after, _ := l.Allow(ctx, "r", 20, 1); !ok {
			t.Fatalf("after waiting retryAfter: denied, retryAfter=%s", after)
		}
	})
	t.Run("ConcurrentCallersShareBucket", func(t *testing.T) {
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 10 {
					ok, _, err := l.Allow(ctx, "shared", 0.001, 25)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						allowed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if n := allowed.Load(); n != 25 {
			t.Fatalf("%d of 100 calls allowed, want exactly the burst of 25", n)
		}
	})
	t.Run("RejectsBadParameters", func(t *testing.T) {
		for _, tc := range []struct {
			rate  float64
			burst int
		}{{0, 1}, {-1, 1}, {1, 0}} {
			if _, _, err := l.Allow(ctx, "x", tc.rate, tc.burst); err == nil {
				t.Fatalf("Allow(rate %v, burst %d) succeeded, want an error", tc.rate, tc.burst)
			}
		}
	})
	t.Run("IdleBucketExpires", func(t *testing.T) {
		l.Allow(ctx, "idle", 1000, 2)
		ttl := c.PTTL(ctx, l.prefix+"idle").Val()
		if ttl <= 0 || ttl > 2*time.Second {
			t.Fatalf("bucket TTL = %s, want a short expiry", ttl)
		}
	})
}
