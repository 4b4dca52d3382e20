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
type limiter struct {
	now  func() time.Time
	mu   sync.Mutex
	last map[string]time.Time
}

func newLimiter(now func() time.Time) *limiter {
	return &limiter{now: now, last: make(map[string]time.Time)}
}

// Allow reports whether key may fire now and, if not, how long to wait.
func (l *limiter) Allow(_ context.Context, key string, every time.Duration) (bool, time.Duration, error) {
	ok, wait := l.allow(key, every, l.now())
	return ok, wait, nil
}

func (l *limiter) allow(key string, every time.Duration, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.last) > 100000 { // forget stale keys so the map stays bounded
		for k, t := range l.last {
			if now.Sub(t) > time.Hour {
				delete(l.last, k)
			}
		}
	}
	if t, ok := l.last[key]; ok && now.Sub(t) < every {
		return false, every - now.Sub(t)
	}
	l.last[key] = now
	return true, 0
}
