package chat

import (
	"context"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// convMute answers conv_mute and conv_unmute: the caller, a current
// member, mutes (until a time, or until unmuted) or unmutes the
// conversation's notifications; the answer is the conv frame with
// mute_until, and the caller's connected devices get a conv_mute push.
func (s *Service) convMute(ctx context.Context, c Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	m, perr := s.member(ctx, c.User, f.ConvID)
	if perr != nil {
		return nil, perr
	}
	if m.LeaveSeq != 0 {
		return nil, protocol.Errorf(protocol.CodeNotMember, "no longer a member of this conversation")
	}
	until := f.MuteUntil
	if f.Type == protocol.TypeConvMute {
		if until == 0 {
			until = protocol.MuteForever
		} else if until <= s.now().UnixMilli() {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "mute_until is not in the future")
		}
	}
	if err := s.store.SetConvMute(ctx, c.User, f.ConvID, until); err != nil {
		return nil, s.storeErr("conv mute", err)
	}
	s.fan.Push(ctx, []string{c.User}, &protocol.Frame{Type: protocol.TypeConvMute, ConvID: f.ConvID, MuteUntil: until})
	return s.convAfterChange(ctx, f.ConvID, c.User)
}

// muteUntil is user's mute of conv as the wire shows it: 0 once passed.
func (s *Service) muteUntil(until int64) int64 {
	if until <= s.now().UnixMilli() {
		return 0
	}
	return until
}

// dnd answers dnd_set and dnd_get with the caller's do-not-disturb; a
// change is pushed to the caller's connected devices as the same frame.
func (s *Service) dnd(ctx context.Context, c Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	if c.Admin {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "do-not-disturb belongs to a user")
	}
	if f.Type == protocol.TypeDNDSet {
		var d store.DND
		if f.DND != nil {
			d.Until = f.DND.Until
			if w := f.DND.Daily; w != nil {
				d.Daily, d.Start, d.End, d.Offset = true, w.Start, w.End, w.UTCOffset
			}
		}
		if err := s.store.SetDND(ctx, c.User, d); err != nil {
			return nil, s.storeErr("set dnd", err)
		}
		s.fan.Push(ctx, []string{c.User}, &protocol.Frame{Type: protocol.TypeDND, DND: s.wireDND(d)})
		return &protocol.Frame{Type: protocol.TypeDND, DND: s.wireDND(d)}, nil
	}
	d, err := s.store.DND(ctx, c.User)
	if err != nil {
		return nil, s.storeErr("dnd", err)
	}
	return &protocol.Frame{Type: protocol.TypeDND, DND: s.wireDND(d)}, nil
}

// wireDND is d as the wire shows it: an until passed is left out.
func (s *Service) wireDND(d store.DND) *protocol.DND {
	w := &protocol.DND{Until: s.muteUntil(d.Until)}
	if d.Daily {
		w.Daily = &protocol.DNDWindow{Start: d.Start, End: d.End, UTCOffset: d.Offset}
	}
	return w
}
