package chat

import (
	"context"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// delivered records that a device has every message up to seq and tells the
// peer of a direct conversation (the second tick of the ACK chain). The
// position lives in memory and is persisted in batches (positions.go): a
// repeated or lower ack costs a map lookup, a raising one a receipt.
func (s *Service) delivered(ctx context.Context, c Caller, conv, seq uint64) *protocol.Error {
	nowMS := s.now().UnixMilli()
	sh, e, err := s.posEntry(ctx, c.User, conv, nowMS)
	if err != nil {
		return s.storeErr("delivered", err)
	}
	sh.mu.Lock()
	e.touched = nowMS
	done := seq <= e.seq
	sh.mu.Unlock()
	if done {
		return nil
	}
	ci, err := s.convInfo(ctx, conv, seq, nowMS)
	if err != nil {
		return s.storeErr("delivered", err)
	}
	seq = min(seq, ci.lastSeq)
	sh.mu.Lock()
	raised := seq > e.seq
	if raised {
		e.seq = seq
	}
	sh.mu.Unlock()
	if raised && ci.kind == store.Direct {
		s.receiptTo(ctx, c, conv, seq, protocol.StateDelivered, ci.members, false)
	}
	return nil
}

// read moves the read position (per user by default, so every device of the
// user clears its badge) and tells the user's devices and, in a direct
// conversation, the peer.
func (s *Service) read(ctx context.Context, c Caller, conv, seq uint64) *protocol.Error {
	cv, perr := s.conversation(ctx, c.User, conv)
	if perr != nil {
		return perr
	}
	seq = min(seq, cv.LastSeq)
	if seq == 0 {
		return nil
	}
	before, err := s.store.Read(ctx, c.User, s.readDevice(c), conv)
	if err != nil {
		return s.storeErr("read", err)
	}
	if seq <= before {
		return nil
	}
	if _, err := s.store.SetRead(ctx, c.User, s.readDevice(c), conv, seq); err != nil {
		return s.storeErr("read", err)
	}
	s.sawRead(c.User, s.readDevice(c), conv, seq)
	s.receipt(ctx, c, cv, seq, protocol.StateRead, true)
	return nil
}

func (s *Service) readDevice(c Caller) string {
	if s.cfg.ReadScope == ReadPerDevice {
		return c.Device
	}
	return ""
}

// conversation returns the conversation after checking membership.
func (s *Service) conversation(ctx context.Context, user string, conv uint64) (store.Conversation, *protocol.Error) {
	if _, perr := s.member(ctx, user, conv); perr != nil {
		return store.Conversation{}, perr
	}
	cv, err := s.store.Conversation(ctx, conv)
	if err != nil {
		return cv, s.storeErr("conversation", err)
	}
	return cv, nil
}

func (s *Service) receipt(ctx context.Context, c Caller, cv store.Conversation, seq uint64, state string, self bool) {
	var members []string
	if cv.Kind == store.Direct {
		var err error
		if members, err = s.directMembers(ctx, cv.ID); err != nil {
			s.log.Warn("receipt: members", "err", err)
			return
		}
	}
	s.receiptTo(ctx, c, cv.ID, seq, state, members, self)
}

// receiptTo pushes a receipt to the members other than the caller (a
// direct conversation's peer) and, with self, to the caller's devices.
func (s *Service) receiptTo(ctx context.Context, c Caller, conv, seq uint64, state string, members []string, self bool) {
	var users []string
	if self {
		users = append(users, c.User)
	}
	for _, m := range members {
		if m != c.User {
			users = append(users, m)
		}
	}
	s.fan.Push(ctx, users, &protocol.Frame{
		Type: protocol.TypeReceipt, ConvID: conv, UserID: c.User, DeviceID: c.Device, Seq: seq, State: state,
	})
}
