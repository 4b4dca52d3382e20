package chat

import (
	"context"
	"sync"
	"time"
)

// limiter allows one event per key per interval (@everyone per group,
// typing per user and conversation). In-process: each chat process limits
// the requests it serves.
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
	rotated   time.Time
	// window is the longest interval asked for so far.
	window time.Duration
}

func newLimiter(now func() time.Time) *limiter {
	return &limiter{now: now, cur: make(map[string]time.Time)}
}

// Allow reports whether key may fire now and, if not, how long to wait.
func (l *limiter) Allow(_ context.Context, key string, every time.Duration) (bool, time.Duration, error) {
	ok, wait := l.allow(key, every, l.now())
	return ok, wait, nil
}

func (l *limiter) allow(key string, every time.Duration, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.window = max(l.window, every)
	if l.rotated.IsZero() {
		l.rotated = now
	}
	if age := now.Sub(l.rotated); age >= l.window {
		// A key set in cur stays reachable for a window after cur ends.
		l.prev = l.cur
		if age >= 2*l.window {
			l.prev = nil // nothing in cur is recent enough to matter
		}
		l.cur = make(map[string]time.Time, len(l.cur)/2)
		l.rotated = now
	}
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

// size is the number of keys remembered (tests).
func (l *limiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.cur) + len(l.prev)
}
