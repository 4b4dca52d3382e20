package chat

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// The server API's entry points (internal/admin calls them). They run the
// client path's own code (send, openDirect, createGroup, addMembers,
// removeMembers, setRole, mute): the same validation, permissions and
// seqs. The admin acts in one of two ways:
//
//   - as a user (or a bot, a user account of its own): the Caller is that
//     user, with exactly that user's rights;
//   - with the operator's authority (Caller.Admin, User = the admin actor
//     id): on any group it has the owner's rights without being a member
//     — add, remove and mute anyone but the owner, set roles, hand the
//     group over (the owner then becomes an admin) — and it may recall or
//     edit any member's text message, with no recall window. Its events
//     carry "admin": true and the actor id as actor and sender.
//
// The admin never produces the body of an end-to-end encrypted
// conversation: a notice or a moderation edit there answers
// e2e_unsupported (a recall, which has no body, is allowed), and a message
// sent as a user must be an envelope that user's client encrypted.

// Limits are the protocol limits the service was configured with (a
// forwarded server API request is checked against them again).
func (s *Service) Limits() protocol.Limits { return s.cfg.Limits }

// AdminDevice is the sender_device of what the admin authority stores.
const AdminDevice = "admin-api"

// adminGroup is group for the admin authority: any group, with the owner's
// rights; the conversation must exist (not_found) and be a group.
func (s *Service) adminGroup(ctx context.Context, convID uint64) (store.Conversation, store.Member, *protocol.Error) {
	cv, err := s.store.Conversation(ctx, convID)
	if err != nil {
		return cv, store.Member{}, s.storeErr("conversation", err)
	}
	if cv.Kind != store.Group {
		return cv, store.Member{}, protocol.Errorf(protocol.CodeInvalidArgument, "only groups have members to manage")
	}
	return cv, store.Member{ConvID: convID, Role: store.RoleOwner}, nil
}

// owners are the current owners of conv but except.
func (s *Service) owners(ctx context.Context, convID uint64, except string) ([]string, *protocol.Error) {
	members, err := s.store.Members(ctx, convID)
	if err != nil {
		return nil, s.storeErr("members", err)
	}
	var out []string
	for _, m := range members {
		if m.Role == store.RoleOwner && m.UserID != except {
			out = append(out, m.UserID)
		}
	}
	return out, nil
}

// adminView drops the caller-specific fields of a conv frame: the admin
// is no member, so it has no role and no join_seq.
func adminView(f *protocol.Frame, perr *protocol.Error) (*protocol.ConvInfo, *protocol.Error) {
	if perr != nil {
		return nil, perr
	}
	info := f.Conv
	info.Role, info.JoinSeq = "", 0
	if info.Members == nil {
		info.Members = []string{}
	}
	return info, nil
}

// AdminOpenDirect returns the direct conversation of a and b (created on
// first use), as a's open_direct does.
func (s *Service) AdminOpenDirect(ctx context.Context, a, b string, e2e bool) (*protocol.ConvInfo, *protocol.Error) {
	return adminView(s.openDirect(ctx, Caller{User: a}, b, e2e))
}

// AdminCreateGroup creates a group owned by owner, as owner's
// create_group does.
func (s *Service) AdminCreateGroup(ctx context.Context, owner, name string, members []string, e2e bool) (*protocol.ConvInfo, *protocol.Error) {
	return adminView(s.createGroup(ctx, Caller{User: owner}, name, members, e2e))
}

// AdminConv describes any conversation.
func (s *Service) AdminConv(ctx context.Context, convID uint64) (*protocol.ConvInfo, *protocol.Error) {
	return adminView(s.convAfterChange(ctx, convID, ""))
}

// AdminUserConversations is user's conversation list, as conv_list
// answers it, ordered by conv_id and paged: at most limit entries with a
// conv_id above after; more reports whether others follow.
func (s *Service) AdminUserConversations(ctx context.Context, user string, after uint64, limit int) (list []protocol.ConvSummary, more bool, perr *protocol.Error) {
	rows, err := s.store.UserConversations(ctx, user)
	if err != nil {
		return nil, false, s.storeErr("conversations", err)
	}
	slices.SortFunc(rows, func(a, b store.ConvRow) int {
		switch {
		case a.ConvID < b.ConvID:
			return -1
		case a.ConvID > b.ConvID:
			return 1
		}
		return 0
	})
	i, _ := slices.BinarySearchFunc(rows, after+1, func(r store.ConvRow, id uint64) int {
		switch {
		case r.ConvID < id:
			return -1
		case r.ConvID > id:
			return 1
		}
		return 0
	})
	rows = rows[i:]
	if len(rows) > limit {
		rows, more = rows[:limit], true
	}
	list, perr = s.summaries(ctx, Caller{User: user}, rows)
	if list == nil && perr == nil {
		list = []protocol.ConvSummary{}
	}
	return list, more, perr
}

// AdminFrame runs a membership frame (add_members, remove_members,
// set_role, mute) with the admin authority; actor names the admin in the
// events.
func (s *Service) AdminFrame(ctx context.Context, actor string, f *protocol.Frame) (*protocol.ConvInfo, *protocol.Error) {
	c := Caller{User: actor, Device: AdminDevice, Admin: true}
	switch f.Type {
	case protocol.TypeAddMembers:
		return adminView(s.addMembers(ctx, c, f.ConvID, f.Members))
	case protocol.TypeRemove:
		return adminView(s.removeMembers(ctx, c, f.ConvID, f.Members, "member_removed"))
	case protocol.TypeSetRole:
		return adminView(s.setRole(ctx, c, f.ConvID, f.UserID, f.Role))
	case protocol.TypeMute:
		return adminView(s.mute(ctx, c, f.ConvID, f.UserID, f.Muted))
	}
	return nil, protocol.Errorf(protocol.CodeUnknownType, "%q is not an admin membership request", f.Type)
}

// AdminSend runs a send frame as user c (not the admin authority): the
// client path's checks, seq and ack, and its fan-out.
func (s *Service) AdminSend(ctx context.Context, c Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	if c.Admin {
		return nil, protocol.Errorf(protocol.CodeInternal, "a send as a user cannot carry the admin authority")
	}
	return s.ackOf(ctx, c, f)
}

// AdminModerate runs an edit or recall frame with the admin authority:
// any sender's text message, no recall window; an edit is refused in an
// E2E conversation.
func (s *Service) AdminModerate(ctx context.Context, actor string, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	if f.Type != protocol.TypeEdit && f.Type != protocol.TypeRecall {
		return nil, protocol.Errorf(protocol.CodeUnknownType, "%q is not a moderation request", f.Type)
	}
	return s.ackOf(ctx, Caller{User: actor, Device: AdminDevice, Admin: true}, f)
}

func (s *Service) ackOf(ctx context.Context, c Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	var ack *protocol.Frame
	if perr := s.send(ctx, c, f, func(r *protocol.Frame) { ack = r }); perr != nil {
		return nil, perr
	}
	if ack == nil {
		return nil, protocol.Errorf(protocol.CodeInternal, "no ack")
	}
	return ack, nil
}

// AdminNotice stores a system message (kind system, event "notice" with
// text) in any conversation, with the admin as sender; retried with the
// same clientMsgID it stores nothing new and answers the first ack
// (duplicate). Refused in E2E conversations (the server would produce
// readable content there).
func (s *Service) AdminNotice(ctx context.Context, actor string, convID uint64, clientMsgID, text string) (*protocol.Frame, *protocol.Error) {
	cv, err := s.store.Conversation(ctx, convID)
	if err != nil {
		return nil, s.storeErr("conversation", err)
	}
	if cv.E2E {
		return nil, protocol.Errorf(protocol.CodeE2EUnsupported, "the server never produces readable content in an end-to-end encrypted conversation")
	}
	body, err := json.Marshal(protocol.SystemEvent{Event: "notice", Actor: actor, Users: []string{}, Admin: true, Text: text})
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInternal, "encode notice")
	}
	if len(body) > s.cfg.Limits.MaxBodyBytes {
		return nil, protocol.Errorf(protocol.CodeTooLarge, "the notice is over max_body_bytes (%d) once encoded", s.cfg.Limits.MaxBodyBytes)
	}
	if clientMsgID == "" {
		clientMsgID = "sys-" + strconv.FormatUint(s.ids.Next(), 36)
	}
	now := s.now()
	res, err := s.store.Append(ctx, store.Append{Msg: store.Message{
		ConvID: convID, MsgID: s.ids.Next(), Sender: actor, SenderDevice: AdminDevice,
		ClientMsgID: clientMsgID, Kind: protocol.KindSystem, Body: string(body), ServerTime: now.UnixMilli(),
	}})
	if err != nil {
		return nil, s.storeErr("append", err)
	}
	s.fan.Enqueue(fanout.Job{Msg: res.Msg, RowsWritten: res.RowsWritten, Conv: &cv})
	m := res.Msg
	return &protocol.Frame{Type: protocol.TypeAck, ConvID: m.ConvID, ClientMsgID: m.ClientMsgID, Seq: m.Seq,
		MsgID: m.MsgID, ServerTime: m.ServerTime, Duplicate: res.Duplicate}, nil
}
