package fanout

import (
	"context"

	"github.com/parley-im/parley/internal/store"
)

// Fan-out tiers. Direct conversations are always small.
const (
	TierSmall  uint8 = 1 // write fan-out to every member's row
	TierMedium uint8 = 2 // rows only for members online at send time
	TierLarge  uint8 = 3 // no rows; push to online members only
)

// TierName names a tier for metrics and the conv frame.
func TierName(t uint8) string {
	switch t {
	case TierSmall:
		return "small"
	case TierMedium:
		return "medium"
	case TierLarge:
		return "large"
	}
	return "unknown"
}

// Tiers are the thresholds: groups with fewer than SmallBelow
// members get write fan-out to every member's row; up to LargeAbove, rows
// only for members online; beyond, no rows at all. Hysteresis (a
// fraction) keeps a group near a threshold from flapping: it moves down a
// tier only once it is that fraction below the threshold.
type Tiers struct {
	SmallBelow int
	LargeAbove int
	Hysteresis float64
}

// For decides the tier of a group of n members that is in tier cur (0:
// undecided). Moving up happens at the thresholds; moving down only once n
// is a Hysteresis fraction below them.
func (c Tiers) For(cur uint8, n int) uint8 {
	up := func(n int) uint8 {
		switch {
		case n > c.LargeAbove:
			return TierLarge
		case n >= c.SmallBelow:
			return TierMedium
		}
		return TierSmall
	}
	target := up(n)
	if cur == 0 || target >= cur {
		return target
	}
	// Going down: only past the threshold minus the hysteresis band.
	smallDown := int(float64(c.SmallBelow) * (1 - c.Hysteresis))
	largeDown := int(float64(c.LargeAbove) * (1 - c.Hysteresis))
	switch {
	case n < smallDown:
		return TierSmall
	case n < largeDown:
		return min(cur, TierMedium)
	}
	return cur
}

// TierFor decides the tier of a group of n members that is in tier cur
// (0: undecided), by the Fanout's tiers.
func (f *Fanout) TierFor(cur uint8, n int) uint8 { return f.tiers.For(cur, n) }

// Tier returns cv's tier, recording a change and keeping the online index
// in step: medium and large groups are tracked, small ones are not.
// Direct conversations are always small.
func (f *Fanout) Tier(ctx context.Context, cv store.Conversation) uint8 {
	if cv.Kind == store.Direct {
		return TierSmall
	}
	t := f.tiers.For(cv.Tier, cv.Members)
	if t != cv.Tier {
		if err := f.st.SetTier(ctx, cv.ID, t); err != nil {
			f.log.Warn("set tier failed; decided again on the next message", "conv", cv.ID, "err", err)
		} else {
			f.log.Info("group changed fan-out tier", "conv", cv.ID, "members", cv.Members, "from", TierName(cv.Tier), "to", TierName(t))
		}
	}
	switch {
	case t == TierSmall && f.online.Tracked(cv.ID):
		f.online.Untrack(cv.ID)
	case t != TierSmall && !f.online.Tracked(cv.ID):
		members, err := f.st.Members(ctx, cv.ID)
		if err != nil {
			f.log.Warn("track group: members", "conv", cv.ID, "err", err)
			return t
		}
		f.online.Track(cv.ID, members)
	}
	return t
}

// Joined tells the online index that members joined conv, before their
// event is stored, so the event and what follows reach them.
func (f *Fanout) Joined(conv uint64, members []store.Member) { f.online.Joined(conv, members) }

// Left tells the online index that users left conv: from here on no push
// reaches them.
func (f *Fanout) Left(conv uint64, users []string) { f.online.Left(conv, users) }
