package client

import (
	"context"
	"fmt"
	"time"

	"github.com/parley-im/parley/protocol"
)

// MuteConv mutes this user's notifications of convID until until (the
// zero time: until UnmuteConv). Messages still arrive and count as
// unread; only push notifications stop (docs/push.md). Every device of
// the user sees it: ConvInfo.MuteUntil and ConvSummary.MuteUntil, and an
// EventMute on the connected ones. Retried like Send.
func (c *Client) MuteConv(ctx context.Context, convID uint64, until time.Time) (protocol.ConvInfo, error) {
	f := protocol.Frame{Type: protocol.TypeConvMute, ConvID: convID}
	if !until.IsZero() {
		f.MuteUntil = until.UnixMilli()
	}
	return c.conv(ctx, f, idempotent)
}

// UnmuteConv unmutes this user's notifications of convID.
func (c *Client) UnmuteConv(ctx context.Context, convID uint64) (protocol.ConvInfo, error) {
	return c.conv(ctx, protocol.Frame{Type: protocol.TypeConvUnmute, ConvID: convID}, idempotent)
}

// SetDND sets this user's do-not-disturb (the zero DND: off): while it
// holds, the server sends no notification (docs/push.md). The connected
// devices of the user get an EventDND.
func (c *Client) SetDND(ctx context.Context, d protocol.DND) (protocol.DND, error) {
	f := protocol.Frame{Type: protocol.TypeDNDSet}
	if d.Until != 0 || d.Daily != nil {
		f.DND = &d
	}
	return c.dnd(ctx, f)
}

// DND reads this user's do-not-disturb.
func (c *Client) DND(ctx context.Context) (protocol.DND, error) {
	return c.dnd(ctx, protocol.Frame{Type: protocol.TypeDNDGet})
}

func (c *Client) dnd(ctx context.Context, f protocol.Frame) (protocol.DND, error) {
	r, _, err := c.do(ctx, f, protocol.TypeDND, idempotent)
	if err != nil {
		return protocol.DND{}, err
	}
	if r.DND == nil {
		return protocol.DND{}, fmt.Errorf("%s: answer has no dnd", f.Type)
	}
	return *r.DND, nil
}
