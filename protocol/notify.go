package protocol

// Notification preferences (docs/protocol.md, "Push notifications"): a
// member mutes a conversation's notifications, forever or until a time,
// and a user sets do-not-disturb. They decide only what the pusher sends;
// unread counts and badges are unchanged. A conversation muted this way
// is not the moderation of mute (a member an admin silenced).

// Client frames of notification preferences.
const (
	TypeConvMute   = "conv_mute"   // mute a conversation's notifications (mute_until; absent: until unmuted); answered by conv
	TypeConvUnmute = "conv_unmute" // unmute them; answered by conv
	TypeDNDSet     = "dnd_set"     // set do-not-disturb (dnd; absent: off); answered by dnd
	TypeDNDGet     = "dnd_get"     // read it; answered by dnd
)

// TypeDND answers dnd_set and dnd_get and is pushed to the user's
// connected devices when it changes; conv_mute (the client frame's type)
// is pushed to them when a conversation's mute changes.
const TypeDND = "dnd"

// MuteForever is the mute_until of a conversation muted until it is
// unmuted: 9999-12-31T23:59:59.999Z, exact in JavaScript.
const MuteForever int64 = 253402300799999

// DND is a user's do-not-disturb: on until Until (unix ms) and, with
// Daily, every day within that window.
type DND struct {
	Until int64      `json:"until,omitempty"`
	Daily *DNDWindow `json:"daily,omitempty"`
}

// DNDWindow is a daily do-not-disturb window: from Start to End, minutes
// after midnight at UTCOffset minutes east of UTC (Start > End: across
// midnight).
type DNDWindow struct {
	Start     int `json:"start"`
	End       int `json:"end"`
	UTCOffset int `json:"utc_offset"`
}

func validateNotify(f *Frame) *Error {
	switch f.Type {
	case TypeConvMute, TypeConvUnmute:
		if e := needConv(f); e != nil {
			return e
		}
		if f.Type == TypeConvUnmute && f.MuteUntil != 0 {
			return Errorf(CodeInvalidArgument, "conv_unmute takes no mute_until")
		}
		if f.MuteUntil < 0 || f.MuteUntil > MuteForever {
			return Errorf(CodeInvalidArgument, "mute_until must be a Unix millisecond time up to %d", MuteForever)
		}
	case TypeDNDSet:
		d := f.DND
		if d == nil {
			return nil
		}
		if d.Until < 0 || d.Until > MuteForever {
			return Errorf(CodeInvalidArgument, "dnd.until must be a Unix millisecond time up to %d", MuteForever)
		}
		if w := d.Daily; w != nil {
			if w.Start < 0 || w.Start >= 1440 || w.End < 0 || w.End >= 1440 || w.Start == w.End {
				return Errorf(CodeInvalidArgument, "dnd.daily start and end must be different minutes of the day (0-1439)")
			}
			if w.UTCOffset < -840 || w.UTCOffset > 840 {
				return Errorf(CodeInvalidArgument, "dnd.daily.utc_offset must be within -840..840 minutes")
			}
		}
	}
	return nil
}
