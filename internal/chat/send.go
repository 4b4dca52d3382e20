package chat

import (
	"context"
	"encoding/json"
	"time"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// send stores a text message or an edit/recall event and acknowledges it.
// Order of work (M7): membership → seq + durable write → ack → push. A
// failed write is reported and nothing is acknowledged.
func (s *Service) send(ctx context.Context, c Caller, f *protocol.Frame, reply func(*protocol.Frame)) *protocol.Error {
	start := s.now()
	if _, perr := s.member(ctx, c.User, f.ConvID); perr != nil {
		return perr
	}
	members, err := s.store.Members(ctx, f.ConvID)
	if err != nil {
		return s.storeErr("members", err)
	}
	rows := make([]string, len(members))
	for i, m := range members {
		rows[i] = m.UserID
	}
	msgID := s.ids.Next()
	a := store.Append{
		Msg: store.Message{
			ConvID: f.ConvID, MsgID: msgID, Sender: c.User, SenderDevice: c.Device,
			ClientMsgID: f.ClientMsgID, Kind: f.Kind, Body: f.Body, TargetSeq: f.TargetSeq,
			ServerTime: start.UnixMilli(),
		},
		Rows: rows,
	}
	if f.TargetSeq != 0 {
		a.Check = s.checkTarget(c, f)
	}
	res, err := s.store.Append(ctx, a)
	if err != nil {
		return s.storeErr("append", err)
	}
	if s.obs.Stored != nil && !res.Duplicate {
		s.obs.Stored(s.now().Sub(start))
	}
	m := res.Msg
	reply(&protocol.Frame{
		Type: protocol.TypeAck, RID: f.RID, ConvID: m.ConvID, ClientMsgID: m.ClientMsgID,
		Seq: m.Seq, MsgID: m.MsgID, ServerTime: m.ServerTime, Duplicate: res.Duplicate,
	})
	// A duplicate is pushed again: the first push may have been lost with
	// the connection that made the client retry. Devices drop it by seq.
	recipients := make([]string, 0, len(members))
	for _, mb := range members {
		if mb.JoinSeq <= m.Seq {
			recipients = append(recipients, mb.UserID)
		}
	}
	wm := wireMessage(m)
	s.push(ctx, recipients, &protocol.Frame{Type: protocol.TypeMsg, Message: &wm}, m.ConvID, m.Seq)
	return nil
}

// checkTarget enforces who may edit or recall what, and rewrites the target.
func (s *Service) checkTarget(c Caller, f *protocol.Frame) func(store.Message) (store.Message, error) {
	now := s.now()
	return func(t store.Message) (store.Message, error) {
		switch {
		case t.Kind != protocol.KindText:
			return t, protocol.Errorf(protocol.CodeConflict, "only text messages can be edited or recalled")
		case t.Sender != c.User:
			return t, protocol.Errorf(protocol.CodeForbidden, "only the sender can edit or recall a message")
		case t.Recalled:
			return t, protocol.Errorf(protocol.CodeConflict, "message %d is recalled", t.Seq)
		case now.Sub(time.UnixMilli(t.ServerTime)) > s.cfg.RecallWindow:
			return t, &protocol.Error{Code: protocol.CodeRecallExpired, Msg: "the edit and recall window has passed"}
		}
		if f.Kind == protocol.KindRecall {
			t.Recalled, t.Body = true, ""
		} else {
			t.Edited, t.Body = true, f.Body
		}
		return t, nil
	}
}

// push sends frame to every online device of users, one bus delivery per
// gateway node (M6). A failed hand-off loses nothing: the message is stored
// and the device fetches it by sync or gap fill.
func (s *Service) push(ctx context.Context, users []string, frame *protocol.Frame, conv, seq uint64) {
	if len(users) == 0 {
		return
	}
	online, err := s.reg.Lookup(ctx, users)
	if err != nil {
		s.log.Warn("registry lookup failed; recipients will sync", "err", err)
		if s.obs.PushFailed != nil {
			s.obs.PushFailed()
		}
		return
	}
	if len(online) == 0 {
		return
	}
	byNode := make(map[string][]string)
	for u, entries := range online {
		for _, e := range entries {
			if l := byNode[e.Node]; len(l) == 0 || l[len(l)-1] != u {
				byNode[e.Node] = append(l, u)
			}
		}
	}
	data, err := json.Marshal(frame)
	if err != nil {
		s.log.Error("encode push", "err", err)
		return
	}
	n := 0
	for node, us := range byNode {
		if err := s.bus.Publish(ctx, node, bus.Delivery{Users: us, Frame: data, ConvID: conv, Seq: seq}); err != nil {
			s.log.Warn("push hand-off failed; recipients will sync", "node", node, "err", err)
			if s.obs.PushFailed != nil {
				s.obs.PushFailed()
			}
			continue
		}
		n += len(us)
	}
	if s.obs.Pushed != nil {
		s.obs.Pushed(n)
	}
}

// delivered records that a device has every message up to seq and tells the
// peer of a direct conversation (the second tick of the ACK chain).
func (s *Service) delivered(ctx context.Context, c Caller, conv, seq uint64) *protocol.Error {
	cv, perr := s.conversation(ctx, c.User, conv)
	if perr != nil {
		return perr
	}
	seq = min(seq, cv.LastSeq)
	before, err := s.store.Delivered(ctx, c.User, conv)
	if err != nil {
		return s.storeErr("delivered", err)
	}
	if seq <= before {
		return nil
	}
	if _, err := s.store.SetDelivered(ctx, c.User, conv, seq); err != nil {
		return s.storeErr("delivered", err)
	}
	if cv.Kind == store.Direct {
		s.receipt(ctx, c, cv, seq, protocol.StateDelivered, false)
	}
	return nil
}

// read moves the read position (per user by default, so every device of the
// user clears its badge, M24) and tells the user's devices and, in a direct
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
	var users []string
	if self {
		users = append(users, c.User)
	}
	if cv.Kind == store.Direct {
		members, err := s.store.Members(ctx, cv.ID)
		if err != nil {
			s.log.Warn("receipt: members", "err", err)
			return
		}
		for _, m := range members {
			if m.UserID != c.User {
				users = append(users, m.UserID)
			}
		}
	}
	s.push(ctx, users, &protocol.Frame{
		Type: protocol.TypeReceipt, ConvID: cv.ID, UserID: c.User, DeviceID: c.Device, Seq: seq, State: state,
	}, 0, 0)
}
