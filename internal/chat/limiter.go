package chat

import (
	"context"
	"sync"
	"time"
)

// limiter allows one event per key per interval (@everyone per group,
// typing per user and conversation), and n events per period with bursts
// of up to n (one-time prekeys handed out per requester and per target
// device). In-process: each chat process limits the requests it serves.
//
// Its memory holds only the keys that fired in the last two windows: keys
// go into the current generation, which becomes the previous one after a
// window (at least the longest interval asked for) and is dropped after
// two, so a key is remembered for at least its interval and expiry costs
// one map swap, never a scan of the keys.
type limiter struct {
	now func() time.Time
	mu  sync.Mutex
	// cur and prev are the generations; rotated is when cur began.
	cur, prev map[string]time.Time
	// curB and prevB are the token buckets of Take, in the same
	// generations: a bucket untouched for its period is full again, so
	// forgetting it changes nothing.
	curB, prevB map[string]bucket
	rotated     time.Time
	// window is the longest interval asked for so far.
	window time.Duration
}

func newLimiter(now func() time.Time) *limiter {
	return &limiter{now: now, cur: make(map[string]time.Time), curB: make(map[string]bucket)}
}

// bucket is a token bucket: tokens left at ts.
type bucket struct {
	tokens float64
	ts     time.Time
}

// Allow reports whether key may fire now and, if not, how long to wait.
func (l *limiter) Allow(_ context.Context, key string, every time.Duration) (bool, time.Duration, error) {
	ok, wait := l.allow(key, every, l.now())
	return ok, wait, nil
}

func (l *limiter) allow(key string, every time.Duration, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rotate(every, now)
	t, ok := l.cur[key]
	if !ok {
		t, ok = l.prev[key]
	}
	if ok && now.Sub(t) < every {
		return false, every - now.Sub(t)
	}
	l.cur[key] = now
	return true, 0
}

// Take takes one of key's n tokens, which refill at n per period (a token
// every period/n), and reports, when none is left, how long until one is.
func (l *limiter) Take(_ context.Context, key string, n int, per time.Duration) (bool, time.Duration, error) {
	ok, wait := l.take(key, n, per, l.now())
	return ok, wait, nil
}

func (l *limiter) take(key string, n int, per time.Duration, now time.Time) (bool, time.Duration) {
	if n < 1 || per <= 0 {
		return false, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rotate(per, now)
	b, ok := l.curB[key]
	if !ok {
		b, ok = l.prevB[key]
	}
	if !ok {
		b = bucket{tokens: float64(n), ts: now}
	}
	if d := now.Sub(b.ts); d > 0 {
		b.tokens = min(float64(n), b.tokens+float64(n)*float64(d)/float64(per))
	}
	b.ts = now
	allowed := b.tokens >= 1
	if allowed {
		b.tokens--
	}
	l.curB[key] = b
	if allowed {
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) * float64(per) / float64(n))
}

// rotate makes cur the previous generation once a window has passed (the
// caller holds mu).
func (l *limiter) rotate(every time.Duration, now time.Time) {
	l.window = max(l.window, every)
	if l.rotated.IsZero() {
		l.rotated = now
	}
	if age := now.Sub(l.rotated); age >= l.window {
		// A key set in cur stays reachable for a window after cur ends.
		l.prev, l.prevB = l.cur, l.curB
		if age >= 2*l.window {
			l.prev, l.prevB = nil, nil // nothing in cur is recent enough to matter
		}
		l.cur = make(map[string]time.Time, len(l.cur)/2)
		l.curB = make(map[string]bucket, len(l.curB)/2)
		l.rotated = now
	}
}

// size is the number of keys remembered (tests).
func (l *limiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.cur) + len(l.prev) + len(l.curB) + len(l.prevB)
}
