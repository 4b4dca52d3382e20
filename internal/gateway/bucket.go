package gateway

import (
	"sync"
	"time"
)

// bucket is a token bucket for admission control: rate tokens per second up
// to burst. take reports whether a token was available and, if not, how long
// until one is.
type bucket struct {
	rate  float64
	burst float64

	mu     sync.Mutex
	tokens float64   // guarded by mu
	last   time.Time // guarded by mu
}

func newBucket(rate float64, burst int, now time.Time) *bucket {
	return &bucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: now}
}

// full reports whether the bucket has refilled to its burst by now.
func (b *bucket) full(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens+now.Sub(b.last).Seconds()*b.rate >= b.burst
}

func (b *bucket) take(now time.Time) (bool, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = min(b.burst, b.tokens+el*b.rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
	return false, wait
}
