package chat

import (
	"fmt"
	"testing"
	"time"
)

// TestLimiterExpires checks the in-process limiter's contract and its
// bound: one event per key per interval, and memory for only the keys of
// the last two windows however many keys it has seen.
func TestLimiterExpires(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := newLimiter(func() time.Time { return now })
	const every = 2 * time.Second
	if ok, _ := l.allow("a", every, now); !ok {
		t.Fatal("first event refused")
	}
	if ok, wait := l.allow("a", every, now.Add(time.Second)); ok || wait != time.Second {
		t.Fatalf("second event 1s later = %v, wait %v; want refused, 1s", ok, wait)
	}
	// Across a rotation the key is still remembered for its interval.
	for i := range 3 {
		l.allow(fmt.Sprint("other", i), every, now.Add(1900*time.Millisecond))
	}
	if ok, _ := l.allow("a", every, now.Add(1999*time.Millisecond)); ok {
		t.Fatal("event before the interval allowed after a rotation")
	}
	if ok, _ := l.allow("a", every, now.Add(2*time.Second)); !ok {
		t.Fatal("event after the interval refused")
	}

	// 1,000,000 distinct keys over time: the limiter holds only those of
	// the last two windows.
	at := now.Add(time.Minute)
	peak := 0
	for i := range 1_000_000 {
		at = at.Add(time.Millisecond) // 1,000 keys per second
		if ok, _ := l.allow(fmt.Sprint("k", i), every, at); !ok {
			t.Fatalf("fresh key %d refused", i)
		}
		peak = max(peak, l.size())
	}
	if limit := 2*int(every/time.Millisecond) + 2; peak > limit {
		t.Fatalf("limiter held up to %d keys at 1,000 keys/s and a %v interval; want ≤ %d", peak, every, limit)
	}
}

// TestLimiterTake checks the in-process token buckets: a burst of n, then
// a token every period/n, a bucket per key, and forgetting idle buckets.
func TestLimiterTake(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := newLimiter(func() time.Time { return now })
	for i := range 3 {
		if ok, _ := l.take("a", 3, time.Hour, now); !ok {
			t.Fatalf("take %d of a burst of 3 refused", i)
		}
	}
	if ok, wait := l.take("a", 3, time.Hour, now); ok || wait != 20*time.Minute {
		t.Fatalf("fourth take = %v, wait %v; want refused, 20m", ok, wait)
	}
	if ok, _ := l.take("b", 3, time.Hour, now); !ok {
		t.Fatal("another key's first take refused")
	}
	if ok, _ := l.take("a", 3, time.Hour, now.Add(19*time.Minute)); ok {
		t.Fatal("take before a token refilled allowed")
	}
	if ok, _ := l.take("a", 3, time.Hour, now.Add(20*time.Minute)); !ok {
		t.Fatal("take after a token refilled refused")
	}
	// A bucket idle for two windows is forgotten and full again.
	later := now.Add(3 * time.Hour)
	l.take("c", 3, time.Hour, later)
	if n := l.size(); n != 1 {
		t.Fatalf("limiter holds %d keys after two idle windows; want 1", n)
	}
	for i := range 3 {
		if ok, _ := l.take("a", 3, time.Hour, later); !ok {
			t.Fatalf("take %d of a refilled bucket refused", i)
		}
	}
	if ok, _ := l.take("a", 0, time.Hour, later); ok {
		t.Fatal("take with n 0 allowed")
	}
}
