package chat

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// maxListedMembers bounds the members listed in a conv frame; member_count
// gives the total.
const maxListedMembers = 1000

func roleName(r store.Role) string {
	switch r {
	case store.RoleOwner:
		return protocol.RoleOwner
	case store.RoleAdmin:
		return protocol.RoleAdmin
	}
	return protocol.RoleMember
}

// group returns a group the caller is a current member of, with the
// caller's membership.
func (s *Service) group(ctx context.Context, c Caller, convID uint64) (store.Conversation, store.Member, *protocol.Error) {
	if c.Admin {
		return s.adminGroup(ctx, convID)
	}
	user := c.User
	m, perr := s.member(ctx, user, convID)
	if perr != nil {
		return store.Conversation{}, m, perr
	}
	if m.LeaveSeq != 0 {
		return store.Conversation{}, m, protocol.Errorf(protocol.CodeNotMember, "no longer a member of this conversation")
	}
	cv, err := s.store.Conversation(ctx, convID)
	if err != nil {
		return cv, m, s.storeErr("conversation", err)
	}
	if cv.Kind != store.Group {
		return cv, m, protocol.Errorf(protocol.CodeInvalidArgument, "only groups have members to manage")
	}
	return cv, m, nil
}

// leaveFanoutWait bounds how long a removal waits for the conversation's
// fan-out to reach its event.
const leaveFanoutWait = 5 * time.Second

// systemEvent stores a membership change as a message of its own (it takes
// a seq) and fans it out like any message.
func (s *Service) systemEvent(ctx context.Context, c Caller, cv store.Conversation, ev protocol.SystemEvent) (uint64, *protocol.Error) {
	ev.Actor, ev.Admin = c.User, c.Admin
	body, err := json.Marshal(ev)
	if err != nil {
		return 0, protocol.Errorf(protocol.CodeInternal, "encode event")
	}
	res, err := s.store.Append(ctx, store.Append{Msg: store.Message{
		ConvID: cv.ID, MsgID: s.ids.Next(), Sender: c.User, SenderDevice: c.Device,
		ClientMsgID: "sys-" + strconv.FormatUint(s.ids.Next(), 36), Kind: protocol.KindSystem,
		Body: string(body), ServerTime: s.now().UnixMilli(),
	}})
	if err != nil {
		return 0, s.storeErr("append", err)
	}
	s.readOwnEvent(ctx, c, cv.ID, res.Msg.Seq)
	j := fanout.Job{Msg: res.Msg, RowsWritten: res.RowsWritten}
	if ev.Event == "member_removed" || ev.Event == "member_left" {
		// The fan-out forgets them right after this event's pushes, before
		// the conversation's next message (Job.Leavers).
		j.Leavers = ev.Users
	}
	s.fan.Enqueue(j)
	return res.Msg.Seq, nil
}

// addMembers: owner or admin only. New members join at last_seq + 1 and
// see the member_added event, nothing before it.
func (s *Service) addMembers(ctx context.Context, c Caller, convID uint64, users []string) (*protocol.Frame, *protocol.Error) {
	cv, m, perr := s.group(ctx, c, convID)
	if perr != nil {
		return nil, perr
	}
	if m.Role < store.RoleAdmin {
		return nil, protocol.Errorf(protocol.CodeForbidden, "only the owner or an admin can add members")
	}
	users = uniqueWithout(users, "")
	if cv.Members+len(users) > s.cfg.Limits.MaxGroupMembers {
		return nil, protocol.Errorf(protocol.CodeTooLarge, "a group has at most %d members", s.cfg.Limits.MaxGroupMembers)
	}
	added, err := s.store.AddMembers(ctx, convID, users, store.RoleMember)
	if err != nil {
		return nil, s.storeErr("add members", err)
	}
	ids := make([]string, len(added))
	for i, a := range added {
		ids[i] = a.UserID
	}
	s.fan.Joined(convID, added)
	if _, perr := s.systemEvent(ctx, c, cv, protocol.SystemEvent{Event: "member_added", Users: ids}); perr != nil {
		return nil, perr
	}
	return s.convAfterChange(ctx, convID, c.User)
}

// removeMembers removes others (owner: anyone; admin: plain members) or,
// with event member_left, the caller. Removed members receive the event
// and nothing after their leave_seq.
func (s *Service) removeMembers(ctx context.Context, c Caller, convID uint64, users []string, event string) (*protocol.Frame, *protocol.Error) {
	cv, m, perr := s.group(ctx, c, convID)
	if perr != nil {
		return nil, perr
	}
	users = uniqueWithout(users, "")
	if event == "member_left" && m.Role == store.RoleOwner && cv.Members > 1 {
		// A group always has an owner: the owner hands the group over
		// (set_role role owner) before leaving it.
		return nil, protocol.Errorf(protocol.CodeForbidden, "the owner cannot leave a group with other members: transfer ownership first (set_role with role owner)")
	}
	if event == "member_removed" {
		for _, u := range users {
			if u == c.User && !c.Admin {
				return nil, protocol.Errorf(protocol.CodeInvalidArgument, "use leave to remove yourself")
			}
			target, err := s.store.Member(ctx, convID, u)
			if err != nil || target.LeaveSeq != 0 {
				return nil, protocol.Errorf(protocol.CodeNotFound, "%s is not a member", u)
			}
			if !outranks(m.Role, target.Role) {
				return nil, protocol.Errorf(protocol.CodeForbidden, "only the owner can remove admins, and only admins can remove members")
			}
		}
	}
	// The event goes first so that the leavers still receive it: the
	// conversation's fan-out runs up to it before they leave (bounded:
	// past it, what they miss they get by sync).
	seq, perr := s.systemEvent(ctx, c, cv, protocol.SystemEvent{Event: event, Users: users})
	if perr != nil {
		return nil, perr
	}
	wctx, cancel := context.WithTimeout(ctx, leaveFanoutWait)
	s.fan.Wait(wctx, convID, seq)
	cancel()
	// The online index forgets them (again, if the event's fan-out did:
	// Job.Leavers) and tells the other chat processes: from here on no
	// push reaches them, and what is stored until their leave_seq they
	// get by sync.
	s.fan.Left(convID, users)
	if _, err := s.store.RemoveMembers(ctx, convID, users); err != nil {
		return nil, s.storeErr("remove members", err)
	}
	return s.convAfterChange(ctx, convID, c.User)
}

// outranks: the owner over everyone else, an admin over plain members.
func outranks(actor, target store.Role) bool {
	return actor == store.RoleOwner && target != store.RoleOwner || actor == store.RoleAdmin && target == store.RoleMember
}

func (s *Service) setRole(ctx context.Context, c Caller, convID uint64, user, role string) (*protocol.Frame, *protocol.Error) {
	cv, m, perr := s.group(ctx, c, convID)
	if perr != nil {
		return nil, perr
	}
	if m.Role != store.RoleOwner {
		return nil, protocol.Errorf(protocol.CodeForbidden, "only the owner can change roles")
	}
	if user == c.User && !c.Admin {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "the owner's role cannot change; transfer ownership with role owner")
	}
	// A non-member answers as mute and remove do.
	target, err := s.store.Member(ctx, convID, user)
	if err != nil || target.LeaveSeq != 0 {
		return nil, protocol.Errorf(protocol.CodeNotFound, "%s is not a member", user)
	}
	if c.Admin && target.Role == store.RoleOwner {
		// As for the owner itself: the owner's role changes only by
		// handing the group to another member.
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "the owner's role cannot change; transfer ownership with role owner")
	}
	r := store.RoleMember
	switch role {
	case protocol.RoleAdmin:
		r = store.RoleAdmin
	case protocol.RoleOwner:
		r = store.RoleOwner
	}
	if err := s.store.SetRole(ctx, convID, user, r); err != nil {
		return nil, s.storeErr("set role", err)
	}
	if r == store.RoleOwner {
		// Ownership moves: the new owner first, so that a failure between
		// the two writes leaves two owners, never none.
		former := []string{c.User}
		if c.Admin {
			// The admin hands the group to user: the owner (not the admin)
			// becomes an admin.
			if former, perr = s.owners(ctx, convID, user); perr != nil {
				return nil, perr
			}
		}
		for _, u := range former {
			if err := s.store.SetRole(ctx, convID, u, store.RoleAdmin); err != nil {
				return nil, s.storeErr("set role", err)
			}
		}
	}
	if _, perr := s.systemEvent(ctx, c, cv, protocol.SystemEvent{Event: "role_changed", Users: []string{user}, Role: role}); perr != nil {
		return nil, perr
	}
	return s.convAfterChange(ctx, convID, c.User)
}

func (s *Service) mute(ctx context.Context, c Caller, convID uint64, user string, muted bool) (*protocol.Frame, *protocol.Error) {
	cv, m, perr := s.group(ctx, c, convID)
	if perr != nil {
		return nil, perr
	}
	target, err := s.store.Member(ctx, convID, user)
	if err != nil || target.LeaveSeq != 0 {
		return nil, protocol.Errorf(protocol.CodeNotFound, "%s is not a member", user)
	}
	if !outranks(m.Role, target.Role) {
		return nil, protocol.Errorf(protocol.CodeForbidden, "only the owner can mute admins, and only admins can mute members")
	}
	if err := s.store.SetMuted(ctx, convID, user, muted); err != nil {
		return nil, s.storeErr("mute", err)
	}
	ev := "muted"
	if !muted {
		ev = "unmuted"
	}
	if _, perr := s.systemEvent(ctx, c, cv, protocol.SystemEvent{Event: ev, Users: []string{user}}); perr != nil {
		return nil, perr
	}
	return s.convAfterChange(ctx, convID, c.User)
}

func (s *Service) convAfterChange(ctx context.Context, convID uint64, user string) (*protocol.Frame, *protocol.Error) {
	cv, err := s.store.Conversation(ctx, convID)
	if err != nil {
		return nil, s.storeErr("conversation", err)
	}
	return s.convFrame(ctx, cv, user)
}

// typing forwards an ephemeral typing notice (never stored) to the other
// online members of a direct conversation or a small group, at most one
// per user and conversation per TypingInterval. Larger groups do not carry
// typing: it would be a fan-out storm for a cosmetic signal.
func (s *Service) typing(ctx context.Context, c Caller, convID uint64) *protocol.Error {
	m, perr := s.member(ctx, c.User, convID)
	if perr != nil {
		return perr
	}
	if m.LeaveSeq != 0 {
		return protocol.Errorf(protocol.CodeNotMember, "no longer a member of this conversation")
	}
	key := "typing:" + c.User + ":" + strconv.FormatUint(convID, 10)
	if ok, _, err := s.limits.Allow(ctx, key, s.cfg.TypingInterval); err != nil || !ok {
		return nil // dropped: the previous notice is still fresh (or the limiter is down)
	}
	cv, err := s.store.Conversation(ctx, convID)
	if err != nil {
		return s.storeErr("conversation", err)
	}
	if s.fan.Tier(ctx, cv) != fanout.TierSmall {
		return nil
	}
	members, err := s.store.Members(ctx, convID)
	if err != nil {
		return s.storeErr("members", err)
	}
	var to []string
	for _, mb := range members {
		if mb.UserID != c.User {
			to = append(to, mb.UserID)
		}
	}
	s.fan.Push(ctx, to, &protocol.Frame{Type: protocol.TypeTyping, ConvID: convID, UserID: c.User})
	return nil
}

// SharesConversation reports whether a and b are current members of a
// common conversation: who may see whose presence.
func (s *Service) SharesConversation(ctx context.Context, a, b string) (bool, error) {
	if a == b {
		return true, nil
	}
	ra, err := s.store.UserConversations(ctx, a)
	if err != nil {
		return false, err
	}
	rb, err := s.store.UserConversations(ctx, b)
	if err != nil {
		return false, err
	}
	mine := make(map[uint64]bool, len(ra))
	for _, r := range ra {
		if r.LeaveSeq == 0 {
			mine[r.ConvID] = true
		}
	}
	for _, r := range rb {
		if r.LeaveSeq == 0 && mine[r.ConvID] {
			return true, nil
		}
	}
	return false, nil
}
