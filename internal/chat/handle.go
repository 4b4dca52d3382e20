package chat

import (
	"context"
	"slices"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Caller is the authenticated sender of a request (protocol.Caller, which
// the gateway fills in without depending on this package).
type Caller = protocol.Caller

// Handle runs one validated client frame. reply is called at most once, with
// the response the frame's rid correlates to, or with an error frame; frames
// that need no answer (delivered/read without rid) get none. For send, reply
// is called as soon as the message is durable, before pushes go out.
func (s *Service) Handle(ctx context.Context, c Caller, f *protocol.Frame, reply func(*protocol.Frame)) {
	resp, perr := s.handle(ctx, c, f, reply)
	switch {
	case perr != nil:
		reply(ErrorFrame(f.RID, perr))
	case resp != nil:
		resp.RID = f.RID
		resp.FillLists()
		reply(resp)
	}
}

// ErrorFrame builds the error frame for rid (protocol.ErrorFrame).
func ErrorFrame(rid string, e *protocol.Error) *protocol.Frame { return protocol.ErrorFrame(rid, e) }

func (s *Service) handle(ctx context.Context, c Caller, f *protocol.Frame, reply func(*protocol.Frame)) (*protocol.Frame, *protocol.Error) {
	switch f.Type {
	case protocol.TypePing:
		return &protocol.Frame{Type: protocol.TypePong, ServerTime: s.now().UnixMilli()}, nil
	case protocol.TypeSend, protocol.TypeEdit, protocol.TypeRecall, protocol.TypeReact:
		return nil, s.send(ctx, c, f, reply)
	case protocol.TypeDelivered:
		if len(f.Positions) == 0 {
			return s.okIfAsked(f, s.delivered(ctx, c, f.ConvID, f.Seq))
		}
		// Every position is applied; the first failure is the answer.
		var first *protocol.Error
		for _, p := range f.Positions {
			if err := s.delivered(ctx, c, p.ConvID, p.Seq); err != nil && first == nil {
				first = err
			}
		}
		return s.okIfAsked(f, first)
	case protocol.TypeRead:
		return s.okIfAsked(f, s.read(ctx, c, f.ConvID, f.Seq))
	case protocol.TypeSync:
		snap, err := s.Snapshot(ctx, c, f.Convs, f.All)
		if err != nil {
			return nil, err
		}
		return &protocol.Frame{Type: protocol.TypeSnapshot, Snapshot: snap}, nil
	case protocol.TypeHistory:
		return s.history(ctx, c, f)
	case protocol.TypeConvList:
		list, err := s.conversations(ctx, c)
		if err != nil {
			return nil, err
		}
		return &protocol.Frame{Type: protocol.TypeConvList, List: list}, nil
	case protocol.TypeOpenDirect:
		return s.openDirect(ctx, c, f.Peer, f.E2E)
	case protocol.TypeCreateGroup:
		return s.createGroup(ctx, c, f.Name, f.Members, f.E2E)
	case protocol.TypeAddMembers:
		return s.addMembers(ctx, c, f.ConvID, f.Members)
	case protocol.TypeRemove:
		return s.removeMembers(ctx, c, f.ConvID, f.Members, "member_removed")
	case protocol.TypeLeave:
		return s.removeMembers(ctx, c, f.ConvID, []string{c.User}, "member_left")
	case protocol.TypeSetRole:
		return s.setRole(ctx, c, f.ConvID, f.UserID, f.Role)
	case protocol.TypeMute:
		return s.mute(ctx, c, f.ConvID, f.UserID, f.Muted)
	case protocol.TypeTyping:
		return s.okIfAsked(f, s.typing(ctx, c, f.ConvID))
	case protocol.TypeKeysUpload, protocol.TypeKeysBundle, protocol.TypeKeysDevices, protocol.TypeKeysRemove:
		return s.keys(ctx, c, f)
	case protocol.TypeConvInfo:
		return s.convInfoFrame(ctx, c, f.ConvID)
	case protocol.TypeSearch:
		return s.searchFrame(ctx, c, f)
	case protocol.TypeReadBy:
		return s.readBy(ctx, c, f.ConvID, f.Seq)
	case protocol.TypePushRegister, protocol.TypePushRemove:
		return s.push(ctx, c, f)
	case protocol.TypeConvMute, protocol.TypeConvUnmute:
		return s.convMute(ctx, c, f)
	case protocol.TypeDNDSet, protocol.TypeDNDGet:
		return s.dnd(ctx, c, f)
	case protocol.TypeKTKeys, protocol.TypeKTConsistency, protocol.TypeKTLeaves:
		return s.ktRequest(ctx, f)
	case protocol.TypeUploadCreate, protocol.TypeUploadStatus, protocol.TypeUploadPart, protocol.TypeUploadComplete, protocol.TypeAttachmentURL:
		if s.attach == nil {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "attachments are not enabled on this server")
		}
		return s.attach.Handle(ctx, c, f)
	}
	return nil, protocol.Errorf(protocol.CodeUnknownType, "unknown frame type %q", f.Type)
}

func (s *Service) okIfAsked(f *protocol.Frame, err *protocol.Error) (*protocol.Frame, *protocol.Error) {
	if err != nil || f.RID == "" {
		return nil, err
	}
	return &protocol.Frame{Type: protocol.TypeOK}, nil
}

// member returns the caller's membership or not_member.
func (s *Service) member(ctx context.Context, user string, conv uint64) (store.Member, *protocol.Error) {
	m, err := s.store.Member(ctx, conv, user)
	if err != nil {
		return m, s.storeErr("member", err)
	}
	return m, nil
}

func (s *Service) history(ctx context.Context, c Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	m, perr := s.member(ctx, c.User, f.ConvID)
	if perr != nil {
		return nil, perr
	}
	limit := f.Limit
	if limit == 0 {
		limit = s.cfg.HistoryDefault
	}
	floor := max(m.JoinSeq, 1)
	ceiling := uint64(1<<63 - 1)
	if m.LeaveSeq != 0 {
		ceiling = m.LeaveSeq
	}
	var (
		msgs []store.Message
		more bool
		err  error
	)
	if f.AfterSeq != nil {
		from := max(*f.AfterSeq+1, floor)
		// One extra tells whether more follow.
		msgs, err = s.store.Messages(ctx, f.ConvID, from, ceiling, limit+1)
		if len(msgs) > limit {
			msgs, more = msgs[:limit], true
		}
	} else {
		before := f.BeforeSeq
		if before == 0 || before > ceiling {
			before = ceiling + 1
		}
		msgs, err = s.store.Latest(ctx, f.ConvID, before, floor, limit+1)
		if len(msgs) > limit {
			msgs, more = msgs[1:], true
		}
	}
	if err == nil {
		err = s.asOfLeave(ctx, f.ConvID, m.LeaveSeq, msgs)
	}
	wire := fanout.WireAll(msgs)
	if err == nil {
		err = s.markReplies(ctx, f.ConvID, wire)
	}
	if err == nil {
		err = s.markReactions(ctx, f.ConvID, c.User, wire)
	}
	if err != nil {
		return nil, s.storeErr("history", err)
	}
	return &protocol.Frame{Type: protocol.TypeHistory, ConvID: f.ConvID, Messages: wire, HasMore: more}, nil
}

func (s *Service) openDirect(ctx context.Context, c Caller, peer string, e2e bool) (*protocol.Frame, *protocol.Error) {
	if peer == c.User {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a direct conversation needs another user")
	}
	direct := s.store.Direct
	if e2e {
		direct = s.store.DirectE2E
	}
	conv, err := direct(ctx, c.User, peer, s.ids.Next(), s.now().UnixMilli())
	if err != nil {
		return nil, s.storeErr("open direct", err)
	}
	return s.convFrame(ctx, conv, c.User)
}

func (s *Service) createGroup(ctx context.Context, c Caller, name string, users []string, e2e bool) (*protocol.Frame, *protocol.Error) {
	users = uniqueWithout(users, c.User)
	if len(users)+1 > s.cfg.Limits.MaxGroupMembers {
		return nil, protocol.Errorf(protocol.CodeTooLarge, "a group has at most %d members", s.cfg.Limits.MaxGroupMembers)
	}
	conv := store.Conversation{ID: s.ids.Next(), Kind: store.Group, Name: name, CreatedAt: s.now().UnixMilli(), E2E: e2e}
	conv.Tier = s.fan.TierFor(0, len(users)+1)
	members := make([]store.Member, 0, len(users)+1)
	members = append(members, store.Member{ConvID: conv.ID, UserID: c.User, Role: store.RoleOwner, JoinSeq: 1})
	for _, u := range users {
		members = append(members, store.Member{ConvID: conv.ID, UserID: u, Role: store.RoleMember, JoinSeq: 1})
	}
	conv.Members = len(members)
	if err := s.store.CreateConversation(ctx, conv, members); err != nil {
		return nil, s.storeErr("create group", err)
	}
	return s.convFrame(ctx, conv, c.User)
}

func (s *Service) convFrame(ctx context.Context, conv store.Conversation, user string) (*protocol.Frame, *protocol.Error) {
	// The mute first: a point read, before a list that may take the rest
	// of a large change's time.
	until, err := s.store.ConvMute(ctx, user, conv.ID)
	if err != nil {
		return nil, s.storeErr("conv mute", err)
	}
	members, err := s.store.Members(ctx, conv.ID)
	if err != nil {
		return nil, s.storeErr("members", err)
	}
	info := &protocol.ConvInfo{ConvID: conv.ID, Kind: conv.Kind.String(), Name: conv.Name, LastSeq: conv.LastSeq, MemberCount: len(members), E2E: conv.E2E,
		MuteUntil: s.muteUntil(until)}
	if conv.Kind == store.Group {
		info.Tier = fanout.TierName(s.fan.TierFor(conv.Tier, len(members)))
	}
	for _, m := range members {
		info.Members = append(info.Members, m.UserID)
		if m.UserID == user {
			info.JoinSeq = m.JoinSeq
			info.Role = roleName(m.Role)
		}
	}
	slices.Sort(info.Members)
	if len(info.Members) > maxListedMembers {
		info.Members = info.Members[:maxListedMembers]
	}
	return &protocol.Frame{Type: protocol.TypeConv, Conv: info}, nil
}

// uniqueWithout returns users without duplicates and without skip.
func uniqueWithout(users []string, skip string) []string {
	seen := make(map[string]bool, len(users))
	out := make([]string, 0, len(users))
	for _, u := range users {
		if u == skip || seen[u] {
			continue
		}
		seen[u] = true
		out = append(out, u)
	}
	return out
}

// asOfLeave shows msgs to a former member (leave, its leave_seq, not 0) as
// they were at leave: nothing written after it, so a message edited later
// keeps the body it had then. A recall hides the message whenever it came
// (a recall is a deletion, store.Store.AsOf).
func (s *Service) asOfLeave(ctx context.Context, conv, leave uint64, msgs []store.Message) error {
	if leave == 0 || len(msgs) == 0 {
		return nil
	}
	return s.store.AsOf(ctx, conv, leave, msgs)
}
