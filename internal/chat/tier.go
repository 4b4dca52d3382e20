package chat

import (
	"context"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
)

// Fan-out tiers, decided by the fanout package. Direct
// conversations are always small.
const (
	TierSmall  = fanout.TierSmall
	TierMedium = fanout.TierMedium
	TierLarge  = fanout.TierLarge
)

// TierName names a tier for metrics and the conv frame.
func TierName(t uint8) string { return fanout.TierName(t) }

// tierFor decides the tier of a group of n members that is in tier cur.
func (c Config) tierFor(cur uint8, n int) uint8 {
	return fanout.Tiers{SmallBelow: c.SmallBelow, LargeAbove: c.LargeAbove, Hysteresis: c.Hysteresis}.For(cur, n)
}

// tier returns cv's tier, recording a change and keeping the online index
// in step: medium and large groups are tracked, small ones are not.
func (s *Service) tier(ctx context.Context, cv store.Conversation) uint8 {
	if cv.Kind == store.Direct {
		return TierSmall
	}
	t := s.cfg.tierFor(cv.Tier, cv.Members)
	if t != cv.Tier {
		if err := s.store.SetTier(ctx, cv.ID, t); err != nil {
			s.log.Warn("set tier failed; decided again on the next message", "conv", cv.ID, "err", err)
		} else {
			s.log.Info("group changed fan-out tier", "conv", cv.ID, "members", cv.Members, "from", TierName(cv.Tier), "to", TierName(t))
		}
	}
	switch {
	case t == TierSmall && s.online.Tracked(cv.ID):
		s.online.Untrack(cv.ID)
	case t != TierSmall && !s.online.Tracked(cv.ID):
		members, err := s.store.Members(ctx, cv.ID)
		if err != nil {
			s.log.Warn("track group: members", "conv", cv.ID, "err", err)
			return t
		}
		s.online.Track(cv.ID, members)
	}
	return t
}

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
