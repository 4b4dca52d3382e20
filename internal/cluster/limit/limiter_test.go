package limit

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/enginetest"
)

var ctx = context.Background()

func TestLimiter(t *testing.T) {
	c := enginetest.Redis(t)
	l := New(c, enginetest.RedisPrefix(t, c))
	t.Run("BurstThenDeny", func(t *testing.T) {
		for i := range 3 {
			if ok, _, err := l.take(ctx, "a", 1, 3); err != nil || !ok {
				t.Fatalf("call %d: ok=%v err=%v, want allowed within the burst", i, ok, err)
			}
		}
		ok, after, err := l.take(ctx, "a", 1, 3)
		if err != nil || ok {
			t.Fatalf("4th call: ok=%v err=%v, want denied", ok, err)
		}
		if after <= 0 || after > time.Second {
			t.Fatalf("retryAfter = %s, want in (0, 1s] at 1 token/s", after)
		}
		if ok, _, _ := l.take(ctx, "b", 1, 3); !ok {
			t.Fatal("key b denied: buckets must be per key")
		}
	})
	t.Run("RefillsAtRate", func(t *testing.T) {
		ok, _, _ := l.take(ctx, "r", 20, 1)
		if !ok {
			t.Fatal("first call denied")
		}
		ok, after, _ := l.take(ctx, "r", 20, 1)
		if ok || after <= 0 || after > 50*time.Millisecond {
			t.Fatalf("second call: ok=%v retryAfter=%s, want denied with ≤50ms", ok, after)
		}
		time.Sleep(after + 5*time.Millisecond)
		if ok, after, _ := l.take(ctx, "r", 20, 1); !ok {
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
					ok, _, err := l.take(ctx, "shared", 0.001, 25)
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
			if _, _, err := l.take(ctx, "x", tc.rate, tc.burst); err == nil {
				t.Fatalf("take(rate %v, burst %d) succeeded, want an error", tc.rate, tc.burst)
			}
		}
	})
	t.Run("IdleBucketExpires", func(t *testing.T) {
		l.take(ctx, "idle", 1000, 2)
		ttl := c.PTTL(ctx, l.prefix+"idle").Val()
		if ttl <= 0 || ttl > 2*time.Second {
			t.Fatalf("bucket TTL = %s, want a short expiry", ttl)
		}
	})
	t.Run("AllowOncePerInterval", func(t *testing.T) {
		if ok, _, err := l.Allow(ctx, "i", 100*time.Millisecond); err != nil || !ok {
			t.Fatalf("first Allow: ok=%v err=%v, want allowed", ok, err)
		}
		ok, after, err := l.Allow(ctx, "i", 100*time.Millisecond)
		if err != nil || ok || after <= 0 || after > 100*time.Millisecond {
			t.Fatalf("second Allow: ok=%v retryAfter=%s err=%v, want denied with ≤100ms", ok, after, err)
		}
		if ok, _, err := l.Allow(ctx, "i", 0); err != nil || !ok {
			t.Fatalf("Allow with no interval: ok=%v err=%v, want allowed", ok, err)
		}
	})
	t.Run("TakeNPerPeriod", func(t *testing.T) {
		for i := range 3 {
			if ok, _, err := l.Take(ctx, "n", 3, time.Hour); err != nil || !ok {
				t.Fatalf("Take %d of a burst of 3: ok=%v err=%v, want allowed", i, ok, err)
			}
		}
		ok, after, err := l.Take(ctx, "n", 3, time.Hour)
		if err != nil || ok || after <= 19*time.Minute || after > 20*time.Minute {
			t.Fatalf("fourth Take: ok=%v retryAfter=%s err=%v, want denied for ≤20m (a token per period/n)", ok, after, err)
		}
		if _, _, err := l.Take(ctx, "n0", 0, time.Hour); err == nil {
			t.Fatal("Take with n 0 did not fail")
		}
		if _, _, err := l.Take(ctx, "p0", 3, 0); err == nil {
			t.Fatal("Take with no period did not fail")
		}
	})
}
