package client

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/parley-im/parley/protocol"
)

// Group administration (docs/protocol.md, "Groups"). Each answer is the
// group as it is after the change (the caller's role included); each
// change is also stored as a system message (kind "system", body a
// protocol.SystemEvent) that reaches every member as EventMessage.
// Refusals come back as *Error: not_member (the caller is not a current
// member), forbidden (the caller's role does not allow it, a muted
// sender, the owner leaving a group that still has members), not_found
// (the user named is not a current member), invalid_argument (not a
// group, yourself in remove_members or set_role).

// RemoveMembers removes members from group convID (the owner anyone
// else, an admin plain members); an E2E group's members then rotate their
// sender keys (client/e2eechat). Removing a user who is already gone
// answers not_found, so RemoveMembers is not repeated after an unknown
// outcome: that comes back as ErrDisconnected or ErrTimeout.
func (c *Client) RemoveMembers(ctx context.Context, convID uint64, members []string) (protocol.ConvInfo, error) {
	return c.conv(ctx, protocol.Frame{Type: protocol.TypeRemove, ConvID: convID, Members: slices.Clone(members)}, once)
}

// Leave removes the caller from group convID (member_left). The owner
// must hand the group over first (SetRole with protocol.RoleOwner) unless
// it is the last member. A second Leave answers not_member, so Leave is
// not repeated after an unknown outcome: that comes back as
// ErrDisconnected or ErrTimeout.
func (c *Client) Leave(ctx context.Context, convID uint64) (protocol.ConvInfo, error) {
	return c.conv(ctx, protocol.Frame{Type: protocol.TypeLeave, ConvID: convID}, once)
}

// SetRole gives user the role protocol.RoleMember or protocol.RoleAdmin in
// group convID (owner only). protocol.RoleOwner hands the group over: user
// becomes the owner and the caller an admin; that transfer is not repeated
// after an unknown outcome (ErrDisconnected / ErrTimeout), the other roles
// are retried like Send.
func (c *Client) SetRole(ctx context.Context, convID uint64, user, role string) (protocol.ConvInfo, error) {
	switch role {
	case protocol.RoleMember, protocol.RoleAdmin, protocol.RoleOwner:
	default:
		return protocol.ConvInfo{}, &Error{Code: protocol.CodeInvalidArgument, Msg: fmt.Sprintf("role %q is not member, admin or owner", role)}
	}
	policy := idempotent
	if role == protocol.RoleOwner {
		policy = once
	}
	return c.conv(ctx, protocol.Frame{Type: protocol.TypeSetRole, ConvID: convID, UserID: user, Role: role}, policy)
}

// Mute mutes (or, with muted false, unmutes) user in group convID: a muted
// member's sends answer forbidden. The owner may mute anyone else, an
// admin plain members. Retried like Send.
func (c *Client) Mute(ctx context.Context, convID uint64, user string, muted bool) (protocol.ConvInfo, error) {
	return c.conv(ctx, protocol.Frame{Type: protocol.TypeMute, ConvID: convID, UserID: user, Muted: muted}, idempotent)
}

// ParseSystemEvent decodes the body of a kind "system" message: a
// membership change (member_added, member_removed, member_left,
// role_changed, muted, unmuted) or, in E2E conversations, a device event.
func ParseSystemEvent(m *protocol.Message) (protocol.SystemEvent, error) {
	var ev protocol.SystemEvent
	if m.Kind != protocol.KindSystem {
		return ev, fmt.Errorf("message %d is a %q message, not a system event", m.Seq, m.Kind)
	}
	if err := json.Unmarshal([]byte(m.Body), &ev); err != nil {
		return ev, fmt.Errorf("system event %d: %w", m.Seq, err)
	}
	return ev, nil
}
