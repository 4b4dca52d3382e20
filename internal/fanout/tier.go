package fanout

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
