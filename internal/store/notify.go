package store

import (
	"context"
	"fmt"
	"time"

	"github.com/parley-im/parley/protocol"
)

// Notification preferences: a member's mute of a conversation's
// notifications, and a user's do-not-disturb. Both only decide what the
// pusher sends; neither is Member.Muted, the moderation that stops a
// member sending.

// MuteForever is the mute-until of a conversation muted until it is
// unmuted (9999-12-31T23:59:59.999Z, as protocol.MuteForever).
const MuteForever = protocol.MuteForever

// DND is a user's do-not-disturb: on until Until (unix ms; 0: not), and,
// with Daily, every day from Start to End, minutes after midnight at
// Offset minutes east of UTC (Start > End: across midnight).
type DND struct {
	Until      int64
	Daily      bool
	Start, End int // 0-1439
	Offset     int // -840..840 (UTC-14:00 to UTC+14:00)
}

// Zero reports whether d is off for good (nothing to store).
func (d DND) Zero() bool { return d == DND{} }

// On reports whether d holds at now.
func (d DND) On(now time.Time) bool {
	if now.UnixMilli() < d.Until {
		return true
	}
	if !d.Daily || d.Start == d.End {
		return false
	}
	local := now.UTC().Add(time.Duration(d.Offset) * time.Minute)
	m := local.Hour()*60 + local.Minute()
	if d.Start < d.End {
		return m >= d.Start && m < d.End
	}
	return m >= d.Start || m < d.End
}

// ValidDND checks d's bounds as every engine may trust them.
func ValidDND(d DND) error {
	switch {
	case d.Until < 0:
		return fmt.Errorf("a negative until %d", d.Until)
	case d.Start < 0 || d.Start >= 24*60 || d.End < 0 || d.End >= 24*60:
		return fmt.Errorf("a daily window %d-%d outside 0-1439 minutes", d.Start, d.End)
	case d.Offset < -14*60 || d.Offset > 14*60:
		return fmt.Errorf("a UTC offset of %d minutes", d.Offset)
	case !d.Daily && (d.Start != 0 || d.End != 0 || d.Offset != 0):
		return fmt.Errorf("a window without daily")
	}
	return nil
}

// Notify is the notification preferences part of a Store.
type Notify interface {
	// SetConvMute mutes user's notifications of convID until until (unix
	// ms; MuteForever: until unmuted), or with until 0 unmutes it. It
	// does not check membership (the caller does).
	SetConvMute(ctx context.Context, user string, convID uint64, until int64) error
	// ConvMute returns user's mute-until of convID (0: not muted; a time
	// past is returned as stored).
	ConvMute(ctx context.Context, user string, convID uint64) (int64, error)
	// ConvMutes lists user's mutes by conversation.
	ConvMutes(ctx context.Context, user string) (map[uint64]int64, error)
	// SetDND stores user's do-not-disturb (the zero DND removes it).
	SetDND(ctx context.Context, user string, d DND) error
	// DND returns user's do-not-disturb (zero: none).
	DND(ctx context.Context, user string) (DND, error)
}

func (c *checked) SetConvMute(ctx context.Context, user string, convID uint64, until int64) error {
	const op = "set conv mute"
	if err := c.enterWrite(ctx, op); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) || convID == 0 || until < 0 || until > MuteForever {
		return fmt.Errorf("%s: %s: invalid user %q, conversation %d or until %d", c.name, op, user, convID, until)
	}
	return c.e.SetConvMute(ctx, user, convID, until)
}

func (c *checked) ConvMute(ctx context.Context, user string, convID uint64) (int64, error) {
	if err := c.enter(ctx, "conv mute"); err != nil {
		return 0, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) {
		return 0, nil
	}
	return c.e.ConvMute(ctx, user, convID)
}

func (c *checked) ConvMutes(ctx context.Context, user string) (map[uint64]int64, error) {
	if err := c.enter(ctx, "conv mutes"); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) {
		return map[uint64]int64{}, nil
	}
	return c.e.ConvMutes(ctx, user)
}

func (c *checked) SetDND(ctx context.Context, user string, d DND) error {
	const op = "set dnd"
	if err := c.enterWrite(ctx, op); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) {
		return fmt.Errorf("%s: %s: invalid user %q", c.name, op, user)
	}
	if err := ValidDND(d); err != nil {
		return fmt.Errorf("%s: %s: %w", c.name, op, err)
	}
	return c.e.SetDND(ctx, user, d)
}

func (c *checked) DND(ctx context.Context, user string) (DND, error) {
	if err := c.enter(ctx, "dnd"); err != nil {
		return DND{}, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) {
		return DND{}, nil
	}
	return c.e.DND(ctx, user)
}
